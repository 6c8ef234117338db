"""`python -m bench.served_ceiling`: the served ceiling of Search (issue 41) -- searches/s
at concurrency 32 on a 2,000-vector collection, where the scan costs nothing and the
request path is all there is, this checkout beside a baseline commit, in one run.

Two `ragplane serve` processes (embedded store, the fake embedder: vectors are sent, not
text): one from a `git worktree` of `--baseline` (the old path), one from this checkout.
Each holds the same 2,000 unit vectors (Gaussian, seeded; `--vectors` for another size)
in a flat collection; queries are 256 of them, perturbed. The load alternates between the
two servers, `--rounds` times, so drift on a shared machine falls on both: each round is
`--requests` searches at concurrency 32 from ghz (Go, one core, the repository's protos;
`scripts/install_tools.sh ghz`), then `--requests` / 10 one at a time from this process
(p50 at concurrency 1). The report gives each server's median, and the ratio of the medians.
Server CPU and context switches per search come from /proc (every thread of the process).

`--bounds` adds two bare gRPC servers to the rounds (`bench.bare_search`: gRPC's threaded
Python server, no ragplane layer, its threads placed as ragplane's `rpc_cpus` default
places them): one that only scans the same vectors with FAISS and builds ten hits, one
that answers a fixed reply. The first is the most any request path
can serve on this machine and client; the report says what fraction of it this path gets.

    python -m bench.served_ceiling [--baseline REV] [--rounds 5] [--requests 10000]
        [--vectors 2000] [--bounds]
        [--json bench/out/served_ceiling.json] [--report JSON]

The servers stay up for the whole run (idle while another is measured); nothing else
should run meanwhile. ~3 minutes on 2 cores (~6 with --bounds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.ann_scale import GHZ, OUT, create, load_run, log, messages, requests, upsert
from bench.bare_search import KINDS as BOUNDS
from bench.bare_search import Bare, start_bare
from bench.common import ROOT, Server, run_concurrent, start_server, table
from ragplane.server.shadow.hardware import cpu_model
from ragplane.v1 import search_pb2_grpc

N, DIM, QUERIES = 2000, 384, 256


def _vectors(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[:QUERIES] + 0.05 * rng.standard_normal((QUERIES, DIM)).astype(np.float32)
    return x, q / np.linalg.norm(q, axis=1, keepdims=True)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def _c1_p50(srv: Server | Bare, reqs: list[dict], total: int) -> float:
    stub = search_pb2_grpc.SearchServiceStub(srv.channel())
    msgs = messages(reqs)
    load = run_concurrent(lambda i: stub.Search(msgs[i % len(msgs)], timeout=60), range(total), 1)
    return load.p(0.5) * 1e3


def measure(baseline: str, rounds: int, total: int, path: Path, n: int = N,
            bounds: bool = False) -> dict:
    """`bounds`: bare gRPC servers (bench.bare_search: the scan alone, a fixed reply) in
    the same rounds, the most any request path could serve here."""
    rev, head = _git("rev-parse", "--short", baseline), _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    tree = Path(tempfile.mkdtemp(prefix="ragplane-ceiling-")) / "baseline"
    _git("worktree", "add", "--detach", str(tree), rev)
    x, q = _vectors(n)
    reqs = requests(q, None, None)
    servers: dict[str, Server | Bare] = {}
    r: dict = {"baseline": rev, "this": head + (" (uncommitted changes)" if dirty else ""),
               "cpu": cpu_model(), "n": n, "rounds": []}  # fmt: skip
    try:
        for name, cwd in (("baseline", tree), ("this", None)):
            servers[name] = srv = start_server("embedder=fake", cwd=cwd)
            create(srv.channel())
            upsert(srv.channel(), x, 0, min(n, 2000), n)
            load_run(srv.channel(), srv.port, reqs, 32, 2000)  # warm: not counted
        for kind in BOUNDS if bounds else ():
            servers[f"bare {kind}"] = bare = start_bare(kind, n)
            load_run(bare.channel(), bare.port, reqs, 32, 2000)
        for i in range(rounds):
            row = {}
            for name, srv in servers.items():
                cpu, switched = srv.cpu_seconds(), srv.switches()
                c32 = load_run(srv.channel(), srv.port, reqs, 32, total)
                cpu_us = (srv.cpu_seconds() - cpu) / total * 1e6
                row[name] = {
                    **{k: c32[k] for k in ("qps", "p50_ms", "p99_ms", "errors", "client")},
                    "cpu_us": cpu_us,
                    "switches": (srv.switches() - switched) / total,
                    "c1_p50_ms": _c1_p50(srv, reqs, max(100, total // 10)),
                }
            r["rounds"].append(row)
            log(f"round {i + 1}: " + ", ".join(f"{k} {v['qps']:,.0f} q/s" for k, v in row.items()))
            path.write_text(json.dumps(r, indent=1))
    finally:
        for srv in servers.values():
            srv.stop()
        # best effort, unlike _git: a failed removal must not hide the run's own error
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True)  # fmt: skip
        shutil.rmtree(tree.parent, ignore_errors=True)
    return r


def _median(r: dict, name: str, key: str) -> float:
    return statistics.median(row[name][key] for row in r["rounds"])


def _switches(r: dict, name: str) -> str:
    if any("switches" not in row[name] for row in r["rounds"]):
        return "-"  # a run from before they were counted
    return f"{_median(r, name, 'switches'):.1f}"


def report(r: dict) -> str:
    names = list(r["rounds"][0])
    label = {"baseline": f"baseline ({r['baseline']})", "this": f"this ({r['this']})",
             "bare scan": "bare gRPC: the scan alone", "bare fixed": "bare gRPC: a fixed reply"}
    rows = [[label.get(name, name),
             " / ".join(f"{row[name]['qps']:,.0f}" for row in r["rounds"]),
             f"{_median(r, name, 'qps'):,.0f}", f"{_median(r, name, 'p50_ms'):.1f}",
             f"{_median(r, name, 'p99_ms'):.1f}", f"{_median(r, name, 'cpu_us'):.0f}",
             _switches(r, name), f"{_median(r, name, 'c1_p50_ms'):.2f}",
             sum(row[name]["errors"] for row in r["rounds"])]
            for name in names]  # fmt: skip
    base = _median(r, "baseline", "qps")
    ratio = _median(r, "this", "qps") / base
    client = r["rounds"][0]["this"]["client"]
    text = (
        table(
            [
                "server",
                "c=32 q/s, each round",
                "median q/s",
                "p50 ms",
                "p99 ms",
                "server CPU µs / search",
                "context switches / search",
                "c=1 p50 ms",
                "errors",
            ],
            rows,
        )
        + f"\n\nCeiling ratio (median q/s, this / baseline): **{ratio:.2f}x** "
        f"({len(r['rounds'])} alternating rounds, c=32 by {client}, {r['n']:,} vectors; "
        f"CPU {r['cpu']})."
    )
    if "bare scan" in names:
        text += (
            f" The scan alone, served by a bare gRPC handler: "
            f"{_median(r, 'bare scan', 'qps') / base:.2f}x the baseline (the most any request "
            f"path reads here); this path serves "
            f"{_median(r, 'this', 'qps') / _median(r, 'bare scan', 'qps'):.0%} of it."
        )
    return text


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.served_ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--baseline", default="105f6d2", help="the commit whose path is the old one")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=10_000, help="searches per round, c=32")
    p.add_argument("--vectors", type=int, default=N,
                   help="the collection's size (the ceiling is measured at 2,000)")
    p.add_argument("--bounds", action="store_true",
                   help="also serve bare gRPC handlers (the scan alone, a fixed reply) in the "
                        "same rounds: what no request path here can beat")
    p.add_argument("--json", default=str(OUT / "served_ceiling.json"))
    p.add_argument("--report", metavar="JSON", help="print the table of an earlier run")
    a = p.parse_args()
    if a.report:
        print(report(json.loads(Path(a.report).read_text())))
        return 0
    if not GHZ.exists():
        log("no .tools/bin/ghz (scripts/install_tools.sh ghz): concurrent load from Python "
            "threads, which take the server's cores")  # fmt: skip
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    print(report(measure(a.baseline, a.rounds, a.requests, Path(a.json), a.vectors,
                             a.bounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
