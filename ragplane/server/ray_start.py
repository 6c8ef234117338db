"""Starting or joining Ray, once for the two places that do it (`ragplane ingest --ray` /
rebuilds on Ray in `server/bulk`, and `embed_backend = ray_serve`). The caller passes its
`ray` module, so that Ray is imported only where a setting asks for it.

A local instance is never started by `ray.init()` in this process. That call starts the
head's processes (GCS, raylet, log monitor, reaper) itself, each through `subprocess` with a
Python `preexec_fn`: that forces a real fork() of this process and runs Python code in the
child before it execs. This process holds gRPC's and Arrow's threads by then (a server, or a
client's channel); the child gets their memory and their locks, held, without the threads,
and gRPC's own fork handlers run in it: it can crash before it execs ("Fatal Python error:
Segmentation fault" from a forked child, seen in a test run). So the head runs as
`ray start --head --block` in a fresh interpreter, launched without `preexec_fn` (CPython
then uses vfork + exec: no Python code and no fork handler runs in a copy of this process),
and this process joins it by address, which starts no process here. The head forks its own
children from that clean interpreter.

The head ends with its starter: `shutdown_ray` stops it (SIGTERM: `ray start --block` stops
everything it started, its reaper the rest of its process group), an exit stops it through
`atexit`, and a starter killed outright stops it through PR_SET_PDEATHSIG (Linux), which
fires when the *thread* that launched it ends; every caller holds its Ray session on the
thread that opened it, for as long as it needs it."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragplane.core.errors import Unavailable

# A loaded machine, or the first start after an install (Ray's binaries not yet in the page
# cache), can take tens of seconds to bring up the GCS and the raylet.
HEAD_START_S = 90.0
# `ray start --block` drains the node on SIGTERM for this long (Ray's default: 30 s), for
# Serve proxies; a head started here has nothing to drain but our own driver.
_DRAIN_S = "1"
# printed once the head runs, before `--block` waits (plain: --log-color=false)
_READY = "will now block"
# ray.init options that shape a new instance; the rest are the driver's own.
_HEAD_FLAGS = {
    "num_cpus": "--num-cpus",
    "num_gpus": "--num-gpus",
    "object_store_memory": "--object-store-memory",
    "include_dashboard": "--include-dashboard",
}
# Runs in the fresh interpreter: die with the launching thread, then be `ray start`.
_LAUNCH = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        sys.exit('the process that launched this head is gone')\n"
    "sys.argv[:2] = ['ray']\n"
    "from ray.scripts.scripts import main\n"
    "main()\n"
)

@dataclass
class LocalHead:
    """A `ray start --head --block` process of this one, in a session (and process group)
    of its own, and the GCS address to join it at."""

    address: str
    process: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.stopped:  # once: after the wait its pid may name another process
            return
        self.stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the group it leads, by its id
        self.process.wait()
        self.log.unlink(missing_ok=True)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return ""


_lock = threading.Lock()
_head: LocalHead | None = None


def init_ray(ray: Any, target: str, **options: Any) -> None:
    """Join Ray: `target == "local"` starts a head here first (`start_head`) with the
    instance options among `options` (num_cpus, object_store_memory, include_dashboard),
    and joins it; any other target is `ray.init(**options)`. A head that does not come up
    (it fails, or misses HEAD_START_S on a loaded machine) is tried once more; a second
    failure is Unavailable with Ray's reason. Ray's other start failures are Unavailable;
    ConnectionError (no cluster at the address) is left to the caller, which knows what
    to suggest. Pair it with `shutdown_ray`."""
    global _head
    if target != "local":
        _init(ray, target, options)
        return
    head_options = {k: options.pop(k) for k in list(options) if k in _HEAD_FLAGS}
    options.pop("address", None)
    with _lock:
        if _head is None:
            try:
                _head = start_head(head_options)
            except Unavailable:
                _head = start_head(head_options)
        address = _head.address
    try:
        _init(ray, target, {**options, "address": address})
    except BaseException:
        shutdown_ray(ray)
        raise


def shutdown_ray(ray: Any) -> None:
    """Leave Ray, and stop the local head if this process started one."""
    global _head
    ray.shutdown()
    with _lock:
        head, _head = _head, None
    if head is not None:
        head.stop()


def start_head(options: dict[str, Any]) -> LocalHead:
    """`ray start --head --block` in a fresh interpreter, waited for until it says it
    runs; its output goes to a file that an error quotes."""
    port, client_port = _free_port(), _free_port()
    argv = [sys.executable, "-c", _LAUNCH, str(os.getpid()), "start", "--head", "--block",
            f"--port={port}", f"--ray-client-server-port={client_port}",
            "--disable-usage-stats", "--log-style=record", "--log-color=false"]
    argv += [f"{_HEAD_FLAGS[k]}={_flag(v)}" for k, v in options.items()]
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": _DRAIN_S}
    log = Path(tempfile.mkstemp(prefix="ragplane-ray-head-", suffix=".log")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    head = LocalHead(f"127.0.0.1:{port}", process, log)
    atexit.register(head.stop)
    deadline = time.monotonic() + HEAD_START_S
    while _READY not in head.output():
        if process.poll() is not None or time.monotonic() > deadline:
            why = "exited" if process.poll() is not None else (
                f"did not start within {HEAD_START_S:.0f} s")
            said = head.output()[-600:]
            head.stop()
            raise Unavailable(f"the local Ray head {why}: {said}")
        time.sleep(0.1)
    # Only a failed start quotes it; unlinked now, nothing is left behind however this
    # process ends (the head keeps writing to its open file; Ray's own logs are the record).
    log.unlink(missing_ok=True)
    return head


def _init(ray: Any, target: str, options: dict[str, Any]) -> None:
    try:
        ray.init(**options)
    except ConnectionError:
        raise
    except Exception as exc:  # Ray raises a bare Exception for a start timeout
        ray.shutdown()
        raise Unavailable(f"Ray did not start ({target}): {exc}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
