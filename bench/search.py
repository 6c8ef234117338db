"""2. Search at concurrency 1, 8, 32 over 100,000 items: coalesced gRPC searches against
one FAISS call per request (coalescing off), beside raw in-process FAISS."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from bench.common import run_concurrent, start_server, table
from ragplane.v1 import common_pb2, index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc

N_ITEMS = 100_000
DIM = 384
N_QUERIES = 256


def _vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def run(n_items: int = N_ITEMS) -> tuple[dict, str]:
    x, q = _vectors(n_items, 0), _vectors(N_QUERIES, 1)
    idx = faiss.IndexFlatIP(DIM)
    idx.add(x)
    t0 = time.perf_counter()
    for row in q[:64]:
        idx.search(row[None, :], 10)
    raw_qps = 64 / (time.perf_counter() - t0)
    results = {"items": n_items, "raw_faiss_single_qps": raw_qps}
    rows = []
    # one data directory for the three servers below (start_server removes its own)
    data_dir = Path(tempfile.mkdtemp(prefix="ragplane-bench-search-")) / "data"
    srv = start_server("embedder=fake", "koder_toml=", data_dir=data_dir)
    try:
        ch = srv.channel()
        index = index_pb2_grpc.IndexServiceStub(ch)
        index.CreateCollection(index_pb2.CreateCollectionRequest(name="bench", dim=DIM))
        for i in range(0, n_items, 2000):
            index.Upsert(
                index_pb2.UpsertRequest(
                    collection="bench",
                    items=[
                        common_pb2.Item(id=str(j), vector=x[j].tolist())
                        for j in range(i, min(i + 2000, n_items))
                    ],
                )
            )
    finally:
        srv.stop()
    qs = [common_pb2.Vector(values=row.tolist()) for row in q]
    for mode, batch in (("coalesced", 64), ("one call per request", 1)):
        srv = start_server(
            "embedder=fake", "koder_toml=", f"search_max_batch={batch}", data_dir=data_dir
        )
        try:
            stub = search_pb2_grpc.SearchServiceStub(srv.channel())
            stub.Search(search_pb2.SearchRequest(collection="bench", vector=qs[0], top_k=10))
            for c in (1, 8, 32):
                load = run_concurrent(
                    lambda v, s=stub: s.Search(
                        search_pb2.SearchRequest(collection="bench", vector=v, top_k=10)
                    ),
                    qs,
                    c,
                )
                results[f"{mode}/c{c}"] = {
                    "qps": load.per_second,
                    "p50_ms": load.p(0.5) * 1e3,
                    "p99_ms": load.p(0.99) * 1e3,
                }
                rows.append(
                    [
                        mode,
                        c,
                        f"{load.per_second:,.1f}",
                        f"{load.p(0.5) * 1e3:.1f}",
                        f"{load.p(0.99) * 1e3:.1f}",
                    ]
                )
        finally:
            srv.stop()
    shutil.rmtree(data_dir.parent, ignore_errors=True)
    for c in (1, 8, 32):
        a, b = results[f"coalesced/c{c}"]["qps"], results[f"one call per request/c{c}"]["qps"]
        results[f"speedup/c{c}"] = a / b
    md = table(["mode", "concurrency", "searches/s", "p50 ms", "p99 ms"], rows)
    md += (
        f"\n\nRaw in-process FAISS (IndexFlatIP, one query per call): {raw_qps:,.1f} "
        "searches/s.\n\nCoalesced / one-call-per-request: "
        + ", ".join(f"c{c} {results[f'speedup/c{c}']:.2f}x" for c in (1, 8, 32))
        + "."
    )
    return results, md
