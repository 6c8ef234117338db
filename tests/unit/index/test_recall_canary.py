"""The rebuild's recall canary tells the truth: it measures with queries the index has not
seen, so it agrees with recall measured on new queries, and IVF_PQ with default settings
passes it (its candidates are rescored with the float vectors)."""

from __future__ import annotations

import numpy as np

from ragplane.index import Engine, IndexParams, IndexType, Metric, RebuildProgress
from ragplane.index.recall import held_out
from ragplane.index.types import SearchKnobs

from .test_search_knobs import recall_at_10
from .vectors import embedding_like, make_records

T = "default"
DIM = 64
N = 12_000
NEW_QUERIES = embedding_like(1000, DIM, seed=11)  # never indexed


def _canary(
    eng: Engine, name: str, kind: IndexType, params: IndexParams, dim: int = DIM, n: int = N,
    **rebuild: float,
) -> tuple[float, np.ndarray]:
    """Rebuild a flat collection of `n` embedding-like vectors as `kind`: the canary's
    recall@10, and the vectors."""
    x = embedding_like(n, dim, seed=10)
    eng.create_collection(T, name, dim=dim, metric=Metric.COSINE, index_type=IndexType.FLAT,
                          embedder="e@1")
    recs = make_records(x)
    for lo in range(0, n, 2000):
        eng.upsert(T, name, recs[lo : lo + 2000])
    reports: list[RebuildProgress] = []
    eng.rebuild(T, name, index_type=kind, params=params, progress=reports.append, **rebuild)
    return next(r.recall for r in reversed(reports) if r.recall is not None), x


def test_canary_agrees_with_held_out_recall_on_hnsw(engine):
    # a sparse graph searched with a short list: recall well below 1, where a canary that
    # asks the indexed vectors themselves reads ~1.0
    weak = IndexParams(hnsw_m=6, hnsw_ef_construction=24, hnsw_ef_search=12)
    canary, x = _canary(engine, "h", IndexType.HNSW, weak, min_recall=0)
    truth = recall_at_10(engine, "h", x, NEW_QUERIES)
    indexed = recall_at_10(engine, "h", x, x[:500])  # what the canary used to ask
    print(f"hnsw canary {canary:.4f} held-out {truth:.4f} indexed {indexed:.4f}")  # noqa: T201
    assert truth < 0.97 and indexed > truth + 0.03
    assert abs(canary - truth) <= 0.02, (canary, truth)


def test_ivf_pq_with_defaults_passes_its_canary(engine):
    # 384 dimensions (the canonical embedder's): the default pq_m 96 leaves 4 dimensions a
    # sub-quantizer, whose codes alone miss some of the true top 10; the rescoring finds them
    canary, x = _canary(engine, "p", IndexType.IVF_PQ, IndexParams(), dim=384, n=6000)
    info = engine.describe(T, "p")
    assert info.index_type == IndexType.IVF_PQ and info.generation == 2  # swapped
    queries = embedding_like(500, 384, seed=11)
    truth = recall_at_10(engine, "p", x, queries)
    codes_only = recall_at_10(engine, "p", x, queries, SearchKnobs(oversampling=1))
    print(f"ivf_pq canary {canary:.4f} held-out {truth:.4f} codes only {codes_only:.4f} "
          f"({info.params})")  # noqa: T201
    assert codes_only < 0.9
    assert canary >= 0.95  # the default min_recall
    assert abs(canary - truth) <= 0.02, (canary, truth)


def test_held_out_sample_is_seeded_and_bounded():
    a, b = held_out(10_000), held_out(10_000)
    assert (a == b).all() and a.sum() == 500
    assert held_out(100).sum() == 20 and held_out(4).sum() == 0
