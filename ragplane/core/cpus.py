"""The request core: the one core where gRPC's threads run a request's Python.

Python runs one thread at a time (the GIL), so a request path of many threads never uses
more than one core for its Python; spread over several it pays for it instead: a thread
that releases the GIL (a FAISS scan, a socket) hands it to a thread on another core,
which the kernel must wake there, and takes it back the same way (BENCHMARKS 19
measures both placements side by side).

So the server pins its gRPC threads (the handler pool and gRPC's polling thread) to the
request cores, and `wide()` lets a pinned thread run on every core while it does work
that needs no GIL (FAISS searches and adds), then brings it back. A thread started by a
pinned thread would inherit its core: rebuilds and other background work are started
inside `wide()`. Servers sharing a machine claim a core each (`claim_core`). Pinning only
places threads: where the platform cannot, the cores were taken away or every core is
claimed, everything runs as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from ragplane.core.errors import InvalidArgument

_lock: Callable[[IO[str]], None] | None
try:
    import fcntl

    def _lock(f: IO[str]) -> None:
        """An exclusive lock on `f`, OSError at once if another holds it."""
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

except ImportError:  # pragma: no cover - not POSIX: nothing is pinned there either
    _lock = None

log = logging.getLogger(__name__)

_CAN = hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


def allowed() -> frozenset[int]:
    """The cores this process may run on (empty where the platform does not say)."""
    return frozenset(os.sched_getaffinity(0)) if _CAN else frozenset()


# Each server holds an exclusive lock on its core's file here for as long as it runs, so
# servers sharing a machine take a core each: two pinned to one core serve less than two
# unpinned (BENCHMARKS 19).
LOCK_DIR = Path(tempfile.gettempdir()) / "ragplane-cores"
_claims: dict[Path, tuple[int, IO[str]]] = {}  # lock dir -> this process's core, its lock


def claim_core(candidates: Sequence[int], lock_dir: Path = LOCK_DIR) -> int | None:
    """The first of `candidates` that no other process on this machine has claimed (an
    exclusive flock on `lock_dir/core-N.lock`, released when this process ends), or None
    when every one is claimed or the locks cannot be taken. One claim a process: asked
    again, the same core."""
    held = _claims.get(lock_dir)
    if held is not None:
        return held[0]
    if _lock is None:
        return None
    try:
        lock_dir.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # another user's: its files may still be ours
            os.chmod(lock_dir, 0o1777)
    except OSError:
        return None
    for core in candidates:
        try:
            f = open(lock_dir / f"core-{core}.lock", "a")  # noqa: SIM115 - held until exit
        except OSError:
            continue
        try:
            _lock(f)
        except OSError:  # claimed by another process
            f.close()
            continue
        _claims[lock_dir] = (core, f)
        return core
    return None


def choose(spec: str, cores: frozenset[int] | None = None, pid: int | None = None,
           claim: Callable[[Sequence[int]], int | None] = claim_core,
           ) -> frozenset[int] | None:  # fmt: skip
    """The request cores of the setting `spec`: "auto" = one allowed core (of `cores`)
    that no other ragplane server on this machine has claimed (`claim`; tried from the
    one the process id picks), when the process may use two or more and one is free;
    "off" = none (no pinning); "N" or "N,M,..." = those cores, which must be allowed.
    None = do not pin."""
    cores = allowed() if cores is None else cores
    spec = spec.strip().lower()
    if spec == "off":
        return None
    if spec == "auto":
        if len(cores) < 2:
            return None  # one core: nowhere else to run
        ordered = sorted(cores)
        start = (os.getpid() if pid is None else pid) % len(ordered)
        core = claim(ordered[start:] + ordered[:start])
        return None if core is None else frozenset({core})
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
        if rc.pinned_here():
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
