"""`python -m bench.soak` (`make soak`): a long Locust mixed run against the real service,
watching the server process for leaks.

Starts `ragplane serve` with the real model (embedder auto, on the CPU) and the repository's
embeddings shadow pair (sample rate 1.0, policy manual so nothing flips, a tenth of the
samples timed A/B/A); runs `python -m loadtest --scenario mixed` against it for --run-time;
every --every seconds records the server's RSS, open file descriptors and threads (psutil)
beside the p50/p99 and failures of the calls that ended in that interval (the load test's
--samples-out).

Memory is two things: data, the vectors the load upserts and remembers (held in the FAISS
indexes; counted each sample through AdminService/Status as items + tombstones + memories,
times dim x 4 bytes), and the process's overhead, RSS less that data. Data grows with the
load by design; the verdict judges overhead.

"After warm-up" is from the first sample at or after --warm-up seconds of load (120 s: every
user running, the collections seeded, the shadow's probe reservoir filling). The model's
allocator does not need it: the server runs its largest pass at start, before it serves
(server.embedding.warmup). The report also gives overhead growth from the first sample.

Verdict, after warm-up: overhead at every sample at most 10% above its value at the
baseline, open fds and threads at the end no more than FD_SLACK / THREAD_SLACK above it,
and zero failed calls. Exit status 0 when all hold, 1 otherwise. With --write, the table
goes into BENCHMARKS.md (section 9).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import psutil

from bench.common import ROOT
from bench.flip import start, write_koder
from ragplane.v1 import admin_pb2, admin_pb2_grpc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

RSS_GROWTH = 0.10
# A thread pool may start a worker late (a rare burst of concurrency): a few are not a leak.
FD_SLACK = 2
THREAD_SLACK = 2


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    threads: int
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    requests: int = 0
    failures: int = 0
    vectors: int = 0  # held in the FAISS indexes: items + tombstones + memories
    data_mb: float = 0.0  # their float32 payload

    @property
    def overhead_mb(self) -> float:
        """RSS less the data: what the process itself holds."""
        return self.rss_mb - self.data_mb


def _data(channel: grpc.Channel) -> tuple[int, float]:
    """(vectors, MB) the server holds for the load: every collection's items and tombstones
    (their vectors stay in the index until a rebuild) and the memories."""
    st = admin_pb2_grpc.AdminServiceStub(channel).Status(admin_pb2.StatusRequest(), timeout=30)
    dims = [(c.count + c.tombstones, c.dim) for c in st.collections]
    dim = max((d for _, d in dims), default=0)
    vectors = sum(n for n, _ in dims) + st.memories
    return vectors, (sum(n * d for n, d in dims) + st.memories * dim) * 4 / 2**20


def _load(port: int, args: argparse.Namespace, samples: Path, summary: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "loadtest", "--scenario", "mixed",
        "--host", f"127.0.0.1:{port}",
        "--users", str(args.users), "--spawn-rate", str(args.users),
        "--run-time", f"{args.run_time}s", "--seed-items", str(args.seed_items),
        "--samples-out", str(samples), "--sample-every", f"{args.every:g}s",
        "--json-out", str(summary),
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)


def _watch(
    pid: int, channel: grpc.Channel, load: subprocess.Popen, every: float, samples: Path
) -> list[Sample]:
    """The server's resources every `every` seconds while the load runs. The clock starts
    with the load itself (the load test opens `samples` then), not with its seeding."""
    proc = psutil.Process(pid)
    out: list[Sample] = []
    while not samples.exists() and load.poll() is None:
        time.sleep(0.2)
    t0 = time.monotonic()
    while load.poll() is None:
        time.sleep(min(1.0, every))
        if time.monotonic() - t0 >= every * (len(out) + 1):
            s = Sample(
                round(time.monotonic() - t0, 1),
                proc.memory_info().rss / 2**20,
                proc.num_fds(),
                proc.num_threads(),
            )
            s.vectors, s.data_mb = _data(channel)
            out.append(s)
    return out


def _merge(watched: list[Sample], samples: Path) -> list[Sample]:
    """Pair each resource sample with the load test's interval that ended nearest to it."""
    lines = [json.loads(x) for x in samples.read_text().splitlines()] if samples.exists() else []
    for s in watched:
        if lines:
            near = min(lines, key=lambda x: abs(x["t_s"] - s.t_s))
            s.p50_ms, s.p99_ms = near["p50_ms"], near["p99_ms"]
            s.requests, s.failures = near["requests"], near["failures"]
    return watched


def verdict(series: list[Sample], warm_up: float, failures: int) -> list[str]:
    """What went wrong (empty: the soak passed)."""
    after = [s for s in series if s.t_s >= warm_up]
    if len(after) < 2:
        return [f"too short: {len(after)} samples after a {warm_up:.0f} s warm-up (need 2)"]
    base, last = after[0], after[-1]
    wrong = []
    growth = _growth(after)
    if growth > RSS_GROWTH:
        wrong.append(
            f"overhead (RSS less data) grew {growth:.1%} after warm-up (limit {RSS_GROWTH:.0%})"
        )
    if last.fds > base.fds + FD_SLACK:
        wrong.append(f"open fds grew {base.fds} -> {last.fds}")
    if last.threads > base.threads + THREAD_SLACK:
        wrong.append(f"threads grew {base.threads} -> {last.threads}")
    if failures:
        wrong.append(f"{failures} calls failed")
    return wrong


def _growth(series: list[Sample], of: str = "overhead_mb") -> float:
    """The highest sample's growth over the first one."""
    base = getattr(series[0], of)
    return max(getattr(s, of) for s in series) / base - 1


def report(r: dict) -> str:
    rows = "\n".join(
        f"| {s['t_s']:.0f} | {s['rss_mb']:.0f} | {s['vectors']} | {s['data_mb']:.1f} | "
        f"{s['rss_mb'] - s['data_mb']:.0f} | {s['fds']} | {s['threads']} | "
        f"{s['p50_ms']:.0f} | {s['p99_ms']:.0f} | {s['requests']} | {s['failures']} |"
        for s in r["series"]
    )
    verdict_line = "**pass**" if not r["wrong"] else "**FAIL**: " + "; ".join(r["wrong"])
    return (
        f"Locust mixed, {r['users']} users, {r['run_time_s']} s, {r['embedder']}, shadow "
        f"{r['shadow']}; warm-up {r['warm_up_s']} s. After warm-up: overhead (RSS less data) "
        f"{r['overhead_growth']:+.1%}, RSS {r['rss_growth']:+.1%}, data "
        f"{r['data_change_mb']:+.1f} MB ({r['vectors_change']:+d} vectors), fds "
        f"{r['fds_change']:+d}, threads {r['threads_change']:+d}; overhead from the first "
        f"sample {r['overhead_growth_all']:+.1%}; {r['requests']} requests, {r['failures']} "
        f"failed: {verdict_line}\n\n"
        "| t (s) | RSS MB | vectors | data MB | overhead MB | open fds | threads | p50 ms "
        "| p99 ms | requests so far | failed so far |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n" + rows + "\n\n"
        "data: the vectors the server holds for the load (items + tombstones + memories, "
        "float32); overhead: RSS less data, what the verdict judges. p50/p99 are of the calls "
        "that ended in each interval. Command: `make soak` (`python -m bench.soak --write`)."
    )


def measure(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="ragplane-soak-"))
    koder = write_koder(work, policy="manual", minimums={}, timing_rate=0.1)
    srv = start(koder, work / "data")
    samples, summary = work / "samples.jsonl", work / "summary.json"
    try:
        load = _load(srv.port, args, samples, summary)
        watched = _watch(srv.sub.proc.pid, srv.channel(), load, args.every, samples)
        series = _merge(watched, samples)
        rc = load.wait()
    finally:
        srv.stop()
    s = json.loads(summary.read_text()) if summary.exists() else {"total": {}}
    failures = s["total"].get("failures", 0) + len(s.get("user_errors", [])) + (rc != 0)
    after = [x for x in series if x.t_s >= args.warm_up] or series or [Sample(0, 1, 0, 0)]
    every = series or after
    return {
        "users": args.users,
        "run_time_s": args.run_time,
        "warm_up_s": args.warm_up,
        "embedder": s.get("embedder", "?"),
        "shadow": "embedder_rs, sample rate 1.0, 10% timed",
        "requests": s["total"].get("requests", 0),
        "failures": failures,
        "rss_growth": _growth(after, "rss_mb"),
        "overhead_growth": _growth(after),
        "overhead_growth_all": _growth(every),
        "data_change_mb": after[-1].data_mb - after[0].data_mb,
        "vectors_change": after[-1].vectors - after[0].vectors,
        "fds_change": after[-1].fds - after[0].fds,
        "threads_change": after[-1].threads - after[0].threads,
        "series": [asdict(x) for x in series],
        "wrong": verdict(series, args.warm_up, failures),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    p.add_argument("--run-time", type=int, default=600, help="seconds of load")
    p.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--warm-up", type=float, default=120.0, help="seconds before the baseline")
    p.add_argument("--users", type=int, default=8, help="Locust users (closed loop)")
    p.add_argument("--seed-items", type=int, default=300, help="passages seeded for search")
    p.add_argument("--json-out", default="", help="also write the numbers here")
    p.add_argument("--write", action="store_true", help="write section 9 of BENCHMARKS.md")
    return p


def run() -> tuple[dict, str]:
    """The `python -m bench --only soak` section, at the defaults."""
    r = measure(parser().parse_args([]))
    return r, report(r)


def main() -> int:
    args = parser().parse_args()
    t0 = time.perf_counter()
    r = measure(args)
    md = report(r)
    print("\n" + md)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=2) + "\n")
    if args.write:
        from bench.__main__ import write_section

        write_section(ROOT / "BENCHMARKS.md", "soak", md, time.perf_counter() - t0)
    return 1 if r["wrong"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
