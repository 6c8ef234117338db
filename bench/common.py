"""Shared pieces of the benchmarks: a real server in a subprocess, a bounded concurrent
load generator on loopback, and percentiles."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.markdown import table
from ragplane.testkit.harness import ROOT, SubprocessServer

__all__ = ["ROOT", "Load", "Server", "run_concurrent", "start_server", "table"]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used, from /proc: what a request path
    costs a server, which the load of other processes changes less than wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_SWITCHES = ("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")


def switches(pid: int) -> int:
    """Context switches (voluntary and not) of process `pid`'s live threads, from /proc: a
    thread handing work or the GIL to another shows as one."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        total += sum(int(ln.split()[1]) for ln in lines if ln.startswith(_SWITCHES))
    return total


@dataclass
class Server:
    """A `ragplane serve` subprocess (testkit.harness.SubprocessServer) for a benchmark."""

    sub: SubprocessServer
    scratch: Path | None = None  # a temporary folder of its own, removed by stop()

    @property
    def port(self) -> int:
        return self.sub.port

    @property
    def data_dir(self) -> Path:
        return self.sub.data_dir

    def channel(self) -> grpc.Channel:
        return self.sub.stubs.channel

    def _status_mb(self, field: str) -> float:
        """A memory figure of the server's /proc/PID/status (kB there), in MiB."""
        assert self.sub.proc is not None
        for line in Path(f"/proc/{self.sub.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        assert self.sub.proc is not None
        return cpu_seconds(self.sub.proc.pid)

    def switches(self) -> int:
        assert self.sub.proc is not None
        return switches(self.sub.proc.pid)

    def peak_rss_mb(self) -> float:
        return self._status_mb("VmHWM")

    def rss_mb(self) -> float:
        return self._status_mb("VmRSS")

    def disk_mb(self) -> float:
        """MiB of the files under its data directory."""
        return sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file()) / 2**20

    def stop(self) -> None:
        self.sub.terminate(timeout=120)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def start_server(
    *settings: str, data_dir: Path | None = None, timeout: float = 300.0, cwd: Path | None = None
) -> Server:
    """`ragplane serve` on 127.0.0.1, port 0, with `--set` settings (FIELD=VALUE); `cwd`:
    the checkout that serves (this one by default)."""
    scratch = None if data_dir else Path(tempfile.mkdtemp(prefix="ragplane-bench-"))
    data_dir = data_dir or scratch / "data"
    extra = [a for s in settings for a in ("--set", s)]
    sub = SubprocessServer(data_dir, *extra, cwd=cwd)
    sub.start(timeout=timeout)
    return Server(sub, scratch)


@dataclass(frozen=True)
class Load:
    seconds: float
    done: int
    latencies: list[float]

    @property
    def per_second(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_concurrent(
    call: Callable[[object], object], items: Sequence[object], concurrency: int
) -> Load:
    """Send every item once with `concurrency` workers; wall time and per-call latency."""
    lock = threading.Lock()
    it = iter(items)
    lat: list[float] = []
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                item = next(it, None)
            if item is None:
                return
            t0 = time.perf_counter()
            try:
                call(item)
            except BaseException as exc:  # reported after the run
                errors.append(exc)
                return
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} calls failed; first: {errors[0]!r}")
    return Load(took, len(lat), lat)
