"""15. The cluster (issue 26): SQLite vs PostgreSQL on one server, 1 vs 3 servers, the apply
lag under Locust's mixed load, and catching up after 100,000 missed writes.

Every server is `ragplane serve` in its own process with the fake embedder (the store is
what is measured: items carry their vectors, 384 dims as the real model's), PostgreSQL 15
runs from Debian's binaries in a temporary folder with fsync on. Upserts: batches of 200
items, the two stores taking turns round by round (same rows, each in its own
collection). Searches: top-10 by vector over 20,000 items, 8 client threads, the stores
(or the 1- and 3-server set-ups) taking turns in short slots. The apply lag is what the
servers that did not take the write report (`ragplane_store_apply_lag_seconds`, commit to
applied) while Locust's mixed scenario runs against the first server.

Upserts and the apply lag are measured `--runs` times (3 by default), each run on fresh
servers and a fresh database, and reported run by run with their spread.

    python -m bench.cluster [--runs 3] [--write]
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import psycopg

from bench.common import ROOT, table
from bench.markdown import replace_block
from ragplane.server.shadow.hardware import cpu_extension, cpu_info
from ragplane.testkit.harness import SubprocessServer
from ragplane.testkit.postgres import LocalPostgres, free_port
from ragplane.v1 import common_pb2, index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc

KEY = "cluster"
HEADING = "## 15. The cluster: SQLite vs PostgreSQL, 1 vs 3 servers, apply lag, catch-up"
DIM = 384
BATCH = 200


def items(start: int, n: int) -> list[common_pb2.Item]:
    rng = np.random.default_rng(start)
    mat = rng.standard_normal((n, DIM)).astype(np.float32)
    return [
        common_pb2.Item(
            id=f"i{start + i}", text=f"item {start + i} of the benchmark", vector=row, metadata=None
        )
        for i, row in enumerate(mat.tolist())
    ]


class Node:
    """A server and its stubs (and its metrics port)."""

    def __init__(self, root: Path, name: str, store: str | None) -> None:
        self.metrics_port = free_port()
        extra = ["--set", f"metrics_port={self.metrics_port}"]
        if store:
            extra += ["--set", f"store={store}"]
        self.sub = SubprocessServer(root / name, *extra)
        self.sub.start(timeout=120)
        ch = self.sub.stubs.channel
        self.index = index_pb2_grpc.IndexServiceStub(ch)
        self.search = search_pb2_grpc.SearchServiceStub(ch)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.sub.port}"

    def metric(self, name: str) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return "\n".join(line for line in text.splitlines() if line.startswith(name))


def upsert_as_a_client(node: Node, batch: list[common_pb2.Item], refused: list[float]) -> None:
    """One Upsert as ragplane-client sends it: UNAVAILABLE with a retry-after is waited out
    and sent again (the client's policy for idempotent RPCs); each refusal is counted."""
    for _ in range(20):
        try:
            node.index.Upsert(index_pb2.UpsertRequest(collection="up", items=batch))
            return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            after = dict(e.trailing_metadata() or ()).get("retry-after", "0.1")
            refused.append(float(after))
            time.sleep(float(after))
    raise RuntimeError("an upsert refused 20 times")


def upsert_rates(nodes: dict[str, Node], rounds: int = 10, per_round: int = 2000) -> dict:
    """Rows/s per store, the stores taking turns each round (order alternating); the
    calls each store refused (UNAVAILABLE, then sent again) under "refused"."""
    spent = dict.fromkeys(nodes, 0.0)
    refused: dict[str, list[float]] = {name: [] for name in nodes}
    for node in nodes.values():
        node.index.CreateCollection(index_pb2.CreateCollectionRequest(name="up", dim=DIM))
    for r in range(rounds):
        batches = [items(r * per_round + lo, BATCH) for lo in range(0, per_round, BATCH)]
        order = list(nodes) if r % 2 == 0 else list(reversed(nodes))
        for name in order:
            t0 = time.perf_counter()
            for b in batches:
                upsert_as_a_client(nodes[name], b, refused[name])
            spent[name] += time.perf_counter() - t0
    rates: dict = {name: rounds * per_round / s for name, s in spent.items()}
    rates["refused"] = {name: len(v) for name, v in refused.items()}
    return rates


def search_rates(
    setups: dict[str, list[Node]], slots: int = 8, seconds: float = 3.0, threads: int = 8
) -> dict:
    """Searches/s per set-up (a list of servers, spread round robin), taking turns."""
    rng = np.random.default_rng(5)
    queries = [
        common_pb2.Vector(values=q)
        for q in rng.standard_normal((512, DIM)).astype(np.float32).tolist()
    ]
    done = dict.fromkeys(setups, 0)
    spent = dict.fromkeys(setups, 0.0)
    for s in range(slots):
        order = list(setups) if s % 2 == 0 else list(reversed(setups))
        for name in order:
            n, took = _search_slot(setups[name], queries, seconds, threads)
            done[name] += n
            spent[name] += took
    return {name: done[name] / spent[name] for name in setups}


def _search_slot(nodes: list[Node], queries: list, seconds: float, threads: int) -> tuple:
    stop = time.perf_counter() + seconds
    counts = [0] * threads
    errors: list[BaseException] = []

    def work(t: int) -> None:
        stub = nodes[t % len(nodes)].search
        for q in itertools.cycle(queries[t::threads]):
            if time.perf_counter() >= stop:
                return
            try:
                stub.Search(search_pb2.SearchRequest(collection="s", vector=q, top_k=10))
            except grpc.RpcError as exc:
                errors.append(exc)
                return
            counts[t] += 1

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"search failed: {errors[0]!r}")
    return sum(counts), time.perf_counter() - t0


def fill_search(node: Node, n: int = 20_000) -> str:
    node.index.CreateCollection(index_pb2.CreateCollectionRequest(name="s", dim=DIM))
    token = ""
    for lo in range(0, n, 1000):
        token = node.index.Upsert(
            index_pb2.UpsertRequest(collection="s", items=items(10**7 + lo, 1000))
        ).consistency_token
    return token


def lag_quantiles(text: str) -> tuple[float, float, int]:
    """p50 and p99 of a Prometheus histogram's buckets (upper bounds), and its count."""
    buckets = [
        (float(m.group(1)), float(m.group(2)))
        for m in re.finditer(r'_bucket\{le="([^"]+)"\} ([0-9.e+]+)', text)
        if m.group(1) != "+Inf"
    ]
    count = float(re.search(r"_count ([0-9.e+]+)", text).group(1))

    def q(p: float) -> float:
        for le, c in buckets:
            if c >= p * count:
                return le
        return float("inf")

    return q(0.5), q(0.99), int(count)


def apply_lag(nodes: list[Node], seconds: int = 30) -> dict:
    """Locust's mixed scenario against the first server; the lag the others report."""
    before = [lag_quantiles(n.metric("ragplane_store_apply_lag_seconds"))[2] for n in nodes[1:]]
    cmd = [
        sys.executable,
        "-m",
        "loadtest",
        "--scenario",
        "mixed",
        "--users",
        "16",
        "--spawn-rate",
        "8",
        "--run-time",
        f"{seconds}s",
        "--host",
        nodes[0].target,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 300)
    out = {}
    for node, n0 in zip(nodes[1:], before, strict=True):
        p50, p99, n = lag_quantiles(node.metric("ragplane_store_apply_lag_seconds"))
        out[node.target] = {"p50": p50, "p99": p99, "changes": n - n0}
    out["locust_rc"] = done.returncode
    out["locust_tail"] = done.stdout[-600:]
    return out


def catch_up(root: Path, pg: LocalPostgres, missed: int = 100_000) -> dict:
    url = pg.create_database("catchup")
    a = Node(root, "cu_a", url)
    c = Node(root, "cu_c", url)
    a.index.CreateCollection(index_pb2.CreateCollectionRequest(name="m", dim=DIM))
    c.sub.stop()
    t0 = time.perf_counter()
    c.sub.start(timeout=600)  # nothing missed: the start itself
    base = time.perf_counter() - t0
    c.sub.stop()
    t0 = time.perf_counter()
    for lo in range(0, missed, 1000):
        a.index.Upsert(index_pb2.UpsertRequest(collection="m", items=items(lo, 1000)))
    write = time.perf_counter() - t0
    t0 = time.perf_counter()
    c.sub.start(timeout=900)
    took = time.perf_counter() - t0
    info = c.sub.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="m"))
    for n in (a, c):
        n.sub.stop()
    return {
        "missed": missed,
        "start_s": base,
        "catch_up_start_s": took,
        "count": info.count,
        "write_s": write,
    }


def measure(runs: int = 1) -> dict:
    root = Path(tempfile.mkdtemp(prefix="ragplane-bench-cluster-"))
    root.chmod(0o755)  # PostgreSQL runs as its own user (we may be root): it must get in
    try:
        return _measure(root, runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(root: Path, runs: int = 1) -> dict:
    """`runs` times: fresh servers on a fresh database, upserts side by side and the apply
    lag; searches (1 and 3 servers) in the first run, catch-up once at the end."""
    res: dict = {"runs": []}
    with LocalPostgres(root / "pg", durable=True) as pg:
        for r in range(runs):
            res["runs"].append(_run(root, pg, r, searches=r == 0, into=res))
        res["upsert_rows_s"] = res["runs"][0]["upsert_rows_s"]
        res["apply_lag"] = res["runs"][0]["apply_lag"]
        res["catch_up"] = catch_up(root, pg)
        with psycopg.connect(pg.url()) as c:
            res["postgres"] = "PostgreSQL " + c.execute("SHOW server_version").fetchone()[0]
    return res


def _run(root: Path, pg: LocalPostgres, r: int, searches: bool, into: dict) -> dict:
    lite = Node(root, f"lite{r}", None)
    url = pg.create_database(f"one{r}")
    one = Node(root, f"pg1_{r}", url)
    out: dict = {}
    others: list[Node] = []
    try:
        out["upsert_rows_s"] = upsert_rates({"SQLite": lite, "PostgreSQL": one})
        token = ""
        if searches:
            fill_search(lite)
            token = fill_search(one)
        others = [Node(root, f"pg2_{r}", url), Node(root, f"pg3_{r}", url)]
        if searches:
            for n in others:  # caught up before anything is timed
                n.index.DescribeCollection(
                    index_pb2.DescribeCollectionRequest(name="s", consistency_token=token)
                )
            into["search_qps"] = search_rates(
                {
                    "SQLite, 1 server": [lite],
                    "PostgreSQL, 1 server": [one],
                    "PostgreSQL, 3 servers": [one, *others],
                }
            )
        out["apply_lag"] = apply_lag([one, *others])
    finally:
        for n in (lite, one, *others):
            n.sub.stop()
    return out


def _runs_table(runs: list[dict], ratios: list[float]) -> str:
    """Each run's upserts and apply lag, then the ratios' spread."""
    rows = [
        [
            str(i + 1),
            f"{r['upsert_rows_s']['SQLite']:,.0f}",
            f"{r['upsert_rows_s']['PostgreSQL']:,.0f}",
            f"{ratio:.2f}x",
            " / ".join(
                f"<= {v['p99'] * 1e3:.0f} ms"
                for v in r["apply_lag"].values()
                if isinstance(v, dict)
            ),
            " / ".join(str(n) for n in r["upsert_rows_s"].get("refused", {}).values()) or "-",
        ]
        for i, (r, ratio) in enumerate(zip(runs, ratios, strict=True))
    ]
    head = ["run", "SQLite upserts/s", "PostgreSQL upserts/s", "PostgreSQL / SQLite",
            "apply lag p99 (both other servers)",
            "upserts refused and sent again (SQLite / PostgreSQL)"]
    return (
        table(head, rows) + "\n\n"
        f"Upserts, PostgreSQL / SQLite over the {len(runs)} runs: {min(ratios):.2f}x to "
        f"{max(ratios):.2f}x (spread {max(ratios) - min(ratios):.2f}, mean "
        f"{sum(ratios) / len(ratios):.2f}x)."
    )


def markdown(res: dict) -> str:
    model, flags = cpu_info()
    ext = {"avx512": "AVX-512", "avx2": "AVX2"}.get(cpu_extension(flags), cpu_extension(flags))
    up = res["upsert_rows_s"]
    qps = res["search_qps"]
    lag = {k: v for k, v in res["apply_lag"].items() if isinstance(v, dict)}
    cu = res["catch_up"]
    runs = res.get("runs") or [{"upsert_rows_s": up, "apply_lag": res["apply_lag"]}]
    ratios = [r["upsert_rows_s"]["PostgreSQL"] / r["upsert_rows_s"]["SQLite"] for r in runs]
    rows = [
        [
            f"upsert rows/s (batches of 200, 384 dims; run 1 of {len(runs)})",
            f"{up['SQLite']:,.0f}",
            f"{up['PostgreSQL']:,.0f}",
            f"{min(ratios):.2f}-{max(ratios):.2f}x in {len(runs)} runs",
            ">= 0.7x in each",
        ],
        [
            "search QPS (top-10, 20,000 items, 8 threads)",
            f"{qps['SQLite, 1 server']:,.0f}",
            f"{qps['PostgreSQL, 1 server']:,.0f}",
            f"{qps['PostgreSQL, 1 server'] / qps['SQLite, 1 server']:.2f}x",
            ">= 0.95x",
        ],
    ]
    out = [
        f"CPU: {model} ({ext}), {len(__import__('os').sched_getaffinity(0))} cores; "
        f"{res.get('postgres', 'PostgreSQL')} on the same machine, fsync on.",
        "",
        table(["", "SQLite", "PostgreSQL", "PostgreSQL / SQLite", "goal"], rows),
        "",
        table(
            ["search QPS", "1 server", "3 servers (round robin)", "3 / 1"],
            [
                [
                    "PostgreSQL store",
                    f"{qps['PostgreSQL, 1 server']:,.0f}",
                    f"{qps['PostgreSQL, 3 servers']:,.0f}",
                    f"{qps['PostgreSQL, 3 servers'] / qps['PostgreSQL, 1 server']:.2f}x",
                ]
            ],
        ),
        "",
        table(
            [
                "apply lag under Locust mixed (16 users, 30 s) on",
                "changes",
                "p50",
                "p99",
                "goal p99",
            ],
            [
                [
                    t,
                    str(v["changes"]),
                    f"<= {v['p50'] * 1e3:.0f} ms",
                    f"<= {v['p99'] * 1e3:.0f} ms",
                    "< 250 ms",
                ]
                for t, v in lag.items()
            ],
        ),
        "",
        _runs_table(runs, ratios),
        "",
        f"Catch-up: a server restarted after missing {cu['missed']:,} writes (1,000 per "
        f"upsert, {cu['write_s']:.0f} s to write) served after {cu['catch_up_start_s']:.1f} s, "
        f"against {cu['start_s']:.1f} s for a start with nothing missed; it answered "
        f"count = {cu['count']:,} at once.",
        "",
        "(Lag quantiles are the histogram's bucket bounds: the true value is at most that.)",
    ]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    p.add_argument("--write", action="store_true", help=f"update BENCHMARKS.md's {KEY} block")
    p.add_argument("--runs", type=int, default=3,
                   help="runs of the upserts and the apply lag, each on fresh servers")
    a = p.parse_args()
    res = measure(a.runs)
    md = markdown(res)
    print(md)
    import json

    out = ROOT / "bench" / "out" / "cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str))
    if a.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_block(path.read_text(), KEY, md, HEADING))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
