"""10. Dense vs lexical vs hybrid search: quality on a labelled set from real text, and
latency at 100,000 items.

Quality: the documents and queries of `bench.hybrid_set` (stdlib docstrings and pydoc
topics; identifier and rare-term queries where words matter, hand-written paraphrases and
descriptions where meaning matters) searched over gRPC through a server with the canonical
embedder (all-MiniLM-L6-v2). recall@10 and nDCG@10, one relevant document per query.

Latency: 100,000 items of real text (pairs of pydoc sentences) with 384-dim vectors in a
flat index; p50 and p95 of one query at a time for each mode, the modes taking turns so a
shared machine's load falls on all alike. Once the engine in-process (no gRPC, no query
embedding, which dense and hybrid pay alike), once served over gRPC with the canonical
embedder embedding each query.
"""

from __future__ import annotations

import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.common import start_server, table
from bench.hybrid_set import QualitySet, build
from ragplane.index import Engine, IndexType, Metric, Record
from ragplane.index.types import Fusion, FusionMethod
from ragplane.testkit.texts import sentences
from ragplane.v1 import common_pb2, index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc

K = 10
MODES = {
    "dense": (common_pb2.SEARCH_MODE_DENSE, None),
    "lexical (BM25)": (common_pb2.SEARCH_MODE_LEXICAL, None),
    "hybrid, RRF k=60": (
        common_pb2.SEARCH_MODE_HYBRID,
        common_pb2.Fusion(method=common_pb2.FUSION_METHOD_RRF),
    ),
    "hybrid, weighted 0.5": (
        common_pb2.SEARCH_MODE_HYBRID,
        common_pb2.Fusion(method=common_pb2.FUSION_METHOD_WEIGHTED),
    ),
}
N_ITEMS = 100_000
DIM = 384
N_LATENCY_QUERIES = 200


def _ranks(stub, qs: QualitySet, mode: int, fusion) -> list[int | None]:
    """Rank (from 1) of each query's relevant document in its top K, or None."""
    out = []
    for q in qs.queries:
        req = search_pb2.SearchRequest(collection="quality", text=q.text, top_k=K, mode=mode)
        if fusion is not None:
            req.fusion.CopyFrom(fusion)
        ids = [h.id for h in stub.Search(req, timeout=60).hits]
        out.append(ids.index(q.relevant) + 1 if q.relevant in ids else None)
    return out


def _metrics(ranks: list[int | None]) -> tuple[float, float]:
    recall = sum(r is not None for r in ranks) / len(ranks)
    ndcg = sum(1 / math.log2(r + 1) for r in ranks if r is not None) / len(ranks)
    return recall, ndcg


def quality() -> tuple[dict, str]:
    qs = build()
    srv = start_server("embedder=auto", "koder_toml=", "device=cpu")
    try:
        ch = srv.channel()
        index = index_pb2_grpc.IndexServiceStub(ch)
        index.CreateCollection(index_pb2.CreateCollectionRequest(name="quality"))
        for i in range(0, len(qs.docs), 256):
            items = [common_pb2.Item(id=d.id, text=d.text) for d in qs.docs[i : i + 256]]
            index.Upsert(index_pb2.UpsertRequest(collection="quality", items=items), timeout=600)
        stub = search_pb2_grpc.SearchServiceStub(ch)
        ranks = {name: _ranks(stub, qs, mode, fusion) for name, (mode, fusion) in MODES.items()}
    finally:
        srv.stop()
    groups = {"words": "words", "meaning": "meaning", "all": None}
    results: dict = {"docs": len(qs.docs), "queries": {g: 0 for g in groups}}
    rows = []
    for name, rk in ranks.items():
        row: list[object] = [name]
        for g, want in groups.items():
            sel = [r for r, q in zip(rk, qs.queries, strict=True) if want in (None, q.group)]
            results["queries"][g] = len(sel)
            recall, ndcg = _metrics(sel)
            results.setdefault(name, {})[g] = {"recall@10": recall, "ndcg@10": ndcg}
            row += [f"{recall:.3f}", f"{ndcg:.3f}"]
        rows.append(row)
    n = results["queries"]
    md = (
        f"{len(qs.docs)} documents; {n['words']} queries where words matter (identifiers, rare "
        f"terms), {n['meaning']} where meaning matters (paraphrases, descriptions); "
        f"Python {platform.python_version()} docstrings, all-MiniLM-L6-v2.\n\n"
        + table(
            ["mode", "words R@10", "words nDCG@10", "meaning R@10", "meaning nDCG@10",
             "all R@10", "all nDCG@10"],
            rows,
        )
    )  # fmt: skip
    return results, md


def _latency_corpus(rng: np.random.Generator) -> tuple[list[str], list[str]]:
    pool = sentences()
    texts = [f"{pool[i % len(pool)]} {pool[(i * 7919 + 13) % len(pool)]}" for i in range(N_ITEMS)]
    queries = []
    for i in range(N_LATENCY_QUERIES):
        words = pool[int(rng.integers(len(pool)))].split()
        if i % 2:  # a phrase of 3-6 words, stop words and all
            start = int(rng.integers(max(1, len(words) - 3)))
            queries.append(" ".join(words[start : start + int(rng.integers(3, 7))]))
        else:  # the document's longest word, like an identifier or a rare term
            queries.append(max(words, key=len))
    return texts, queries


def _interleaved(runs: dict[str, Callable[[int], object]], n: int) -> dict[str, list[float]]:
    """Milliseconds per call of each run on queries 0..n-1, the runs taking turns query by
    query (in a rotating order), so a shared machine's load falls on every mode alike."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            runs[name](i)
            times[name].append((time.perf_counter() - t0) * 1000)
    return times


def _table(times: dict[str, list[float]]) -> tuple[dict, str]:
    """p50 over the one-word queries (even), the phrases (odd) and all; p95 over all."""
    measured = {
        name: {
            "p50_word_ms": statistics.median(t[0::2]),
            "p50_phrase_ms": statistics.median(t[1::2]),
            "p50_ms": statistics.median(t),
            "p95_ms": statistics.quantiles(t, n=20)[18],
        }
        for name, t in times.items()
    }
    dense_p50 = measured["dense"]["p50_ms"]
    rows = [
        [name, *(f"{m[k]:.2f}" for k in ("p50_word_ms", "p50_phrase_ms", "p50_ms", "p95_ms")),
         f"{m['p50_ms'] / dense_p50:.2f}x"]
        for name, m in measured.items()
    ]  # fmt: skip
    headers = ["mode", "p50 ms, one word", "p50 ms, phrases", "p50 ms", "p95 ms", "p50 / dense"]
    return measured, table(headers, rows)


def _in_process(texts, queries, x, qv) -> tuple[dict, float]:
    """Per-mode latencies of the engine alone; and how long the upserts took."""
    with tempfile.TemporaryDirectory(prefix="ragplane-hybrid-") as d, Engine(Path(d)) as eng:
        eng.create_collection(
            "b", "lat", dim=DIM, metric=Metric.COSINE, index_type=IndexType.FLAT, embedder=""
        )
        t0 = time.perf_counter()
        for i in range(0, N_ITEMS, 5000):
            eng.upsert("b", "lat", [Record(str(j), x[j], texts[j]) for j in range(i, i + 5000)])
        load_s = time.perf_counter() - t0
        runs = {
            "dense": lambda i: eng.search("b", "lat", qv[i], K),
            "lexical (BM25)": lambda i: eng.search_lexical("b", "lat", queries[i], K),
            "hybrid, RRF k=60": lambda i: eng.search_hybrid(
                "b", "lat", queries[i], qv[i], K, fusion=Fusion(FusionMethod.RRF)
            ),
            "hybrid, weighted 0.5": lambda i: eng.search_hybrid(
                "b", "lat", queries[i], qv[i], K, fusion=Fusion(FusionMethod.WEIGHTED)
            ),
        }
        for fn in runs.values():  # warm the caches of both indexes
            for i in range(10):
                fn(i)
        return _interleaved(runs, N_LATENCY_QUERIES), load_s


def _served(texts, queries, x) -> dict[str, list[float]]:
    """Per-mode latencies over gRPC, the query text embedded by the canonical model (the
    items bring their vectors: embedding 100,000 texts on a CPU would take the run)."""
    srv = start_server("embedder=auto", "koder_toml=", "device=cpu")
    try:
        ch = srv.channel()
        index = index_pb2_grpc.IndexServiceStub(ch)
        index.CreateCollection(index_pb2.CreateCollectionRequest(name="lat"))
        for i in range(0, N_ITEMS, 2000):
            items = [
                common_pb2.Item(id=str(j), text=texts[j], vector=x[j].tolist())
                for j in range(i, min(i + 2000, N_ITEMS))
            ]
            index.Upsert(index_pb2.UpsertRequest(collection="lat", items=items), timeout=600)
        stub = search_pb2_grpc.SearchServiceStub(ch)

        def call(mode: int, fusion: common_pb2.Fusion | None = None) -> Callable[[int], object]:
            return lambda i: stub.Search(
                search_pb2.SearchRequest(
                    collection="lat", text=queries[i], top_k=K, mode=mode, fusion=fusion
                )
            )

        runs = {
            "dense": call(common_pb2.SEARCH_MODE_DENSE),
            "lexical (BM25)": call(common_pb2.SEARCH_MODE_LEXICAL),
            "hybrid, RRF k=60": call(common_pb2.SEARCH_MODE_HYBRID, MODES["hybrid, RRF k=60"][1]),
        }
        for fn in runs.values():
            for i in range(10):
                fn(i)
        return _interleaved(runs, N_LATENCY_QUERIES)
    finally:
        srv.stop()


def latency() -> tuple[dict, str]:
    rng = np.random.default_rng(0)
    texts, queries = _latency_corpus(rng)
    x = rng.standard_normal((N_ITEMS, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    qv = rng.standard_normal((N_LATENCY_QUERIES, DIM)).astype(np.float32)
    engine_times, load_s = _in_process(texts, queries, x, qv)
    engine_res, engine_md = _table(engine_times)
    served_res, served_md = _table(_served(texts, queries, x))
    results = {"items": N_ITEMS, "load_seconds": load_s, "engine": engine_res,
               "served": served_res}  # fmt: skip
    md = (
        f"{N_ITEMS:,} items (pydoc sentence pairs, {DIM}-dim vectors, flat index), "
        f"{N_LATENCY_QUERIES} queries (half one long word, half 3-6 word phrases), one at a "
        "time, the modes taking turns query by query. The engine alone (in-process, no query "
        f"embedding; upserting the items with their lexical index took {load_s:.0f} s):\n\n"
        f"{engine_md}\n\nServed over gRPC, the query text embedded by all-MiniLM-L6-v2 (as "
        f"a client sees it; dense and hybrid both pay the embedding):\n\n{served_md}\n\n"
        "Hybrid pays the lexical ranking on top of the dense one. For one-word queries that "
        "is about ten milliseconds; for phrases FTS5 scores every item that holds a query word "
        "(it has no WAND or MaxScore pruning; only words half the items hold are left out), "
        "which sets the phrase p50. Run to run on this shared 2-core machine the ratios move "
        "by +-0.5x with its load; compare modes within one run."
    )
    return results, md


def run() -> tuple[dict, str]:
    q_res, q_md = quality()
    l_res, l_md = latency()
    return {"quality": q_res, "latency": l_res}, f"Quality\n\n{q_md}\n\nLatency\n\n{l_md}"


if __name__ == "__main__":
    res, md = run()
    print(md)
