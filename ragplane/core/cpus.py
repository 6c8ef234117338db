"""The request core: the one core where gRPC's threads run a request's Python.

Python runs one thread at a time (the GIL), so a request path of many threads never uses
more than one core for its Python; spread over several it pays for it instead: a thread
that releases the GIL (a FAISS scan, a socket) hands it to a thread on another core,
which the kernel must wake there, and takes it back the same way. On 2 cores, searches of
a 2,000-vector collection at concurrency 32 served 1,470/s that way and 2,070/s with
gRPC's threads on one core and each FAISS call free to run on any (context switches a
search 21 -> 18, server CPU a search 734 -> 529 us; `python -m bench.served_ceiling`).

So the server pins its gRPC threads (the handler pool and gRPC's polling thread) to the
request cores, and `wide()` lets a pinned thread run on every core while it does work
that needs no GIL (FAISS searches and adds), then brings it back. A thread started by a
pinned thread would inherit its core: rebuilds and other background work are started
inside `wide()`. Pinning only places threads: where the platform cannot, or the cores
were taken away, everything runs as before.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType

from ragplane.core.errors import InvalidArgument

log = logging.getLogger(__name__)

_CAN = hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


def allowed() -> frozenset[int]:
    """The cores this process may run on (empty where the platform does not say)."""
    return frozenset(os.sched_getaffinity(0)) if _CAN else frozenset()


def choose(spec: str, cores: frozenset[int] | None = None, pid: int | None = None
           ) -> frozenset[int] | None:  # fmt: skip
    """The request cores of the setting `spec`: "auto" = one of the allowed `cores`
    (picked by process id, so servers sharing a machine spread over its cores) when there
    are at least two; "off" = none (no pinning); "N" or "N,M,..." = those cores, which
    must be allowed. None = do not pin."""
    cores = allowed() if cores is None else cores
    spec = spec.strip().lower()
    if spec == "off":
        return None
    if spec == "auto":
        if len(cores) < 2:
            return None  # one core: nowhere else to run
        ordered = sorted(cores)
        return frozenset({ordered[(os.getpid() if pid is None else pid) % len(ordered)]})
    try:
        asked = frozenset(int(c) for c in spec.split(","))
    except ValueError:
        raise InvalidArgument(
            f"rpc_cpus {spec!r} is not auto, off or a list of core numbers such as 3 or 2,3"
        ) from None
    if not _CAN:
        raise InvalidArgument("rpc_cpus names cores, but this platform cannot pin threads; "
                              "use auto or off")  # fmt: skip
    if not asked or not asked <= cores:
        raise InvalidArgument(
            f"rpc_cpus {spec!r} names cores this process may not run on; it may run on "
            f"{','.join(map(str, sorted(cores)))}"
        )
    return asked


class RequestCores:
    """Where pinned threads run (`cores`), and every core the process may use (`every`).
    `pin_this_thread` and `wide` are for the threads that serve requests; in any other
    thread `wide` does nothing."""

    def __init__(self, cores: frozenset[int] | None, every: frozenset[int] | None = None) -> None:
        self.cores = cores
        self.every = allowed() if every is None else every
        self._local = threading.local()

    def pin_this_thread(self) -> None:
        """Run the calling thread on the request cores from now on (a handler pool's
        initializer)."""
        if self.cores is None:
            return
        try:
            os.sched_setaffinity(0, self.cores)
        except OSError as exc:  # the cores were taken from the process since: stop pinning
            log.warning("cannot pin request threads to cores %s (%s); they run on any core "
                        "from now on", sorted(self.cores), exc)  # fmt: skip
            self.cores = None
            return
        self._local.pinned = True

    def pinned_here(self) -> bool:
        return getattr(self._local, "pinned", False)

    def wide(self) -> _Wide:
        """A context in which the calling thread, if pinned, may run on every core; threads
        it starts meanwhile are not pinned. Nested, only the outermost acts."""
        return _Wide(self)


class _Wide:
    __slots__ = ("_rc", "_acted")

    def __init__(self, rc: RequestCores) -> None:
        self._rc = rc
        self._acted = False

    def __enter__(self) -> None:
        rc = self._rc
        if getattr(rc._local, "pinned", False):
            try:
                os.sched_setaffinity(0, rc.every)
            except OSError:
                return
            rc._local.pinned = False
            self._acted = True

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        if self._acted:
            self._acted = False
            self._rc.pin_this_thread()


#: The process's request cores: set once by the server at start (`configure`); until then
#: nothing is pinned and `wide()` does nothing.
current = RequestCores(None)


def configure(spec: str) -> RequestCores:
    """Choose the process's request cores from the setting (InvalidArgument if it names
    cores the process may not use) and make them `current`."""
    global current
    cores = choose(spec)
    if cores != current.cores:  # servers of one process (tests) share the one choice
        current = RequestCores(cores)
    return current


def wide() -> _Wide:
    """`current.wide()`: around work that needs no GIL, and around starting threads."""
    return current.wide()
