"""`python -m bench.soak_probe`: where the soak's server memory goes, sampled over a run.

The soak (bench.soak) sees the server from outside: RSS, fds, threads. This runs the same
server in-process (the soak's settings: real model on the CPU, the embeddings shadow pair
at sample rate 1.0) under the same Locust mixed load, and every --every seconds records
RSS beside what might have grown:

- `anon_mb`: anonymous memory (/proc/self/smaps_rollup): heap, arenas, mmapped buffers;
- `malloc_used_mb` / `malloc_free_mb` / `malloc_mmap_mb`: glibc's mallinfo2 over every
  arena: bytes handed out, bytes held free inside arenas (fragmentation, not returned),
  bytes in mmapped chunks. ONNX Runtime's CPU arena and embedder_rs's buffers come from
  malloc, so they are in these;
- `ort_in_flight_max` / `ort_padded_max`: the most ONNX Runtime runs of the canonical at
  once, and the most padded tokens (rows x width) in flight at once: what its arena must
  hold. Each new high-water mark is logged with its time in `events`;
- `rs_tokens_max`: the most tokens one embedder_rs call embedded;
- `vectors` / `vectors_mb`: vectors in the FAISS indexes (data the load upserts);
- `py_mb`: Python's own allocations (tracemalloc), with the top growth by line at the end;
- `threads` / `rpc_threads` / `fds` / `sqlite_readers`: OS threads, the gRPC handler pool's
  threads (started on demand, up to `workers`), open files, and the store's per-thread
  read connections (each thread opens one the first time it reads: two files).

Not in `make test`: it is a diagnostic, minutes long. Writes JSON to --json-out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import psutil

from bench.flip import write_koder
from bench.soak import _load

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo() -> dict[str, float]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return {}
    mb = 2**20
    return {
        "malloc_used_mb": m.uordblks / mb,
        "malloc_free_mb": m.fordblks / mb,
        "malloc_mmap_mb": m.hblkhd / mb,
    }


def _smaps() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        if key in ("Rss", "Anonymous"):
            out[key.lower() + "_mb"] = int(value.split()[0]) / 1024
    return {"anon_mb": out.get("anonymous_mb", 0.0)}


class _Watch:
    """High-water marks of the embedders' runs, with the time each was reached."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.lock = threading.Lock()
        self.in_flight = 0
        self.padded = 0
        self.marks = {"ort_in_flight_max": 0, "ort_padded_max": 0, "rs_tokens_max": 0}
        self.events: list[dict] = []

    def _mark(self, key: str, value: int, what: str) -> None:
        if value > self.marks[key]:
            self.marks[key] = value
            self.events.append(
                {"t_s": round(time.monotonic() - self.t0, 1), key: value, "what": what}
            )

    def onnx(self, run):
        def wrapped(embedder, texts):
            enc = embedder._tok.encode_batch(list(texts))
            padded = len(enc) * max(len(e.ids) for e in enc)
            shape = f"{len(enc)}x{padded // len(enc)}"
            with self.lock:
                self.in_flight += 1
                self.padded += padded
                self._mark("ort_in_flight_max", self.in_flight, shape)
                self._mark("ort_padded_max", self.padded, f"{self.in_flight} run(s), {shape}")
            try:
                return run(embedder, texts)
            finally:
                with self.lock:
                    self.in_flight -= 1
                    self.padded -= padded

        return wrapped

    def rust(self, embed):
        def wrapped(embedder, texts, normalize=True):
            tokens = sum(embedder.count_tokens(texts))
            with self.lock:
                self._mark("rs_tokens_max", tokens, f"{len(texts)} texts")
            return embed(embedder, texts, normalize)

        return wrapped


def _vectors(runtime) -> int:
    return sum(int(c.index.ntotal) for c in runtime.engine._ctx.all() if c.index is not None)


def measure(args: argparse.Namespace) -> dict:
    from ragplane.server.app import create_server
    from ragplane.server.embedding.onnx import OnnxEmbedder
    from ragplane.server.embedding.rust import RustEmbedder
    from ragplane.server.settings import Settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="ragplane-probe-"))
    koder = write_koder(work, policy="manual", minimums={}, timing_rate=0.1)
    watch = _Watch(time.monotonic())
    OnnxEmbedder._run = watch.onnx(OnnxEmbedder._run)
    RustEmbedder.embed = watch.rust(RustEmbedder.embed)
    settings = Settings(
        data_dir=str(work / "data"),
        embedder="auto",
        device="cpu",
        koder_toml=str(koder),
        port=0,
        **dict(kv.split("=", 1) for kv in args.set),
    )
    t_load = time.perf_counter()
    server, port, runtime = create_server(settings)
    server.start()
    loaded_s = time.perf_counter() - t_load
    proc = psutil.Process()
    if args.tracemalloc:
        tracemalloc.start(1)
    samples, summary = work / "samples.jsonl", work / "summary.json"
    load_args = SimpleNamespace(
        users=args.users, run_time=args.run_time, seed_items=args.seed_items, every=args.every
    )
    series: list[dict] = []
    snaps = []
    try:
        load = _load(port, load_args, samples, summary)
        while not samples.exists() and load.poll() is None:
            time.sleep(0.2)
        t0 = time.monotonic()
        watch.t0 = t0  # events before 0 happened while the load test seeded its collection
        for e in watch.events:
            e["t_s"] = "seed"
        while load.poll() is None:
            time.sleep(1.0)
            if time.monotonic() - t0 < args.every * (len(series) + 1):
                continue
            row = {
                "t_s": round(time.monotonic() - t0, 1),
                "rss_mb": proc.memory_info().rss / 2**20,
                **_smaps(),
                **_mallinfo(),
                **watch.marks,
                "vectors": _vectors(runtime),
                "threads": proc.num_threads(),
                "rpc_threads": sum(t.name.startswith("rpc") for t in threading.enumerate()),
                "fds": proc.num_fds(),
                "sqlite_readers": len(runtime.engine._ctx._conns),
            }
            row["vectors_mb"] = row["vectors"] * runtime.embedding.dim * 4 / 2**20
            if args.tracemalloc:
                row["py_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
                if len(snaps) == 0 and row["t_s"] >= args.warm_up:
                    snaps.append(tracemalloc.take_snapshot())
            series.append(row)
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)  # fmt: skip
        load.wait()
        growth = []
        if snaps:
            diff = tracemalloc.take_snapshot().compare_to(snaps[0], "lineno")
            growth = [str(s) for s in diff[:12]]
    finally:
        server.stop(5).wait()
        runtime.close()
    return {
        "loaded_s": round(loaded_s, 1),
        "series": series,
        "events": watch.events,
        "py_growth_after_warm_up": growth,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.soak_probe", description=__doc__)
    p.add_argument("--run-time", type=int, default=300, help="seconds of load")
    p.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    p.add_argument("--warm-up", type=float, default=120.0, help="tracemalloc baseline at")
    p.add_argument("--users", type=int, default=8, help="Locust users (closed loop)")
    p.add_argument("--seed-items", type=int, default=300, help="passages seeded for search")
    p.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations")
    p.add_argument("--set", action="append", default=[], help="a setting, FIELD=VALUE")
    p.add_argument("--json-out", default="", help="write the numbers here")
    return p


def main() -> int:
    args = parser().parse_args()
    r = measure(args)
    for e in r["events"]:
        print(json.dumps(e))
    for line in r["py_growth_after_warm_up"]:
        print(line)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
