"""Shared pieces of the benchmarks: a real server in a subprocess, a bounded concurrent
load generator on loopback, and percentiles."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    data_dir: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        ch = grpc.insecure_channel(
            self.target,
            options=[
                ("grpc.max_send_message_length", 256 << 20),
                ("grpc.max_receive_message_length", 256 << 20),
            ],
        )
        grpc.channel_ready_future(ch).result(timeout=120)
        return ch

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(*settings: str, data_dir: Path | None = None, timeout: float = 300.0) -> Server:
    """`ragplane serve` on 127.0.0.1, port 0, with `--set` settings (FIELD=VALUE)."""
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="ragplane-bench-"))
    port_file = data_dir.parent / f"{data_dir.name}.port"
    port_file.unlink(missing_ok=True)
    args = [
        sys.executable,
        "-m",
        "server.cli",
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        "--set",
        f"port_file={port_file}",
    ]
    for s in settings:
        args += ["--set", s]
    log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return Server(proc, int(port_file.read_text()), data_dir)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: see {log.name}")
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("server did not start")


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


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
