"""FAISS results against exact numpy search (ties handled), and hnsw recall."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.index import IndexType, Metric

from .vectors import brute_force, make_records, make_vectors

T = "default"


def assert_same_topk(hits, exp_scores, exp_pos, *, atol=1e-5):
    """Same scores within `atol`, and the same ids except where scores tie at the cut."""
    got_scores = np.array([h.score for h in hits])
    np.testing.assert_allclose(got_scores, exp_scores, atol=atol, rtol=1e-5)
    kth = exp_scores[-1]
    must = {f"id{p}" for p, s in zip(exp_pos, exp_scores, strict=True) if s > kth + atol}
    got = [h.id for h in hits]
    assert must <= set(got)
    assert len(set(got)) == len(got)


@pytest.mark.parametrize("metric", list(Metric))
def test_flat_matches_numpy(engine, metric):
    dim, n, k = 24, 3000, 10
    x = make_vectors(n, dim, seed=11)
    x[100:110] = x[5]  # exact duplicates: ties at every rank
    engine.create_collection(
        T, "p", dim=dim, metric=metric, index_type=IndexType.FLAT, embedder="e"
    )
    recs = make_records(x)
    for lo in range(0, n, 1000):
        engine.upsert(T, "p", recs[lo : lo + 1000])
    q = np.vstack([make_vectors(40, dim, seed=12), x[5:6]])
    res = engine.search(T, "p", q, k)
    exp_s, exp_p = brute_force(x, q, k, metric)
    for row, r in enumerate(res):
        assert r.exhaustive and r.returned_k == k
        assert_same_topk(r.hits, exp_s[row], exp_p[row])
    # the duplicate group ties: the query equal to x[5] returns ids from it only
    assert {h.id for h in res[-1].hits} <= {"id5"} | {f"id{i}" for i in range(100, 110)}


@pytest.mark.parametrize("metric", list(Metric))
def test_flat_matches_numpy_after_replacements(engine, metric):
    dim, n = 16, 500
    x = make_vectors(n, dim, seed=21)
    engine.create_collection(
        T, "p", dim=dim, metric=metric, index_type=IndexType.FLAT, embedder="e"
    )
    engine.upsert(T, "p", make_records(x))
    y = make_vectors(100, dim, seed=22)
    x[:100] = y
    engine.upsert(T, "p", make_records(y))  # replaces id0..id99
    engine.delete(T, "p", ids=[f"id{i}" for i in range(400, 500)])
    live = x[:400]
    q = make_vectors(20, dim, seed=23)
    exp_s, exp_p = brute_force(live, q, 10, metric)
    for row, r in enumerate(engine.search(T, "p", q, 10)):
        assert_same_topk(r.hits, exp_s[row], exp_p[row])


def _recall(engine, x, q, k, metric):
    _, exp_p = brute_force(x, q, k, metric)
    res = engine.search(T, "h", q, k)
    hits = sum(
        len({h.id for h in r.hits} & {f"id{p}" for p in exp_p[i]}) for i, r in enumerate(res)
    )
    return hits / (len(q) * k), res


@pytest.mark.parametrize(
    ("metric", "n"), [(Metric.COSINE, 10_000), (Metric.IP, 3000), (Metric.L2, 3000)]
)
def test_hnsw_recall_at_defaults(engine, metric, n):
    # unstructured gaussian data is the hard case for a graph index; queries come from
    # the same distribution as the data
    dim = 64
    allx = make_vectors(n + 200, dim, seed=31)
    x, q = allx[:n], allx[n:]
    engine.create_collection(
        T, "h", dim=dim, metric=metric, index_type=IndexType.HNSW, embedder="e"
    )
    recs = make_records(x)
    for lo in range(0, n, 2000):
        engine.upsert(T, "h", recs[lo : lo + 2000])
    recall, res = _recall(engine, x, q, 10, metric)
    print(f"\nhnsw recall@10 ({metric.value}, n={n}, dim={dim}, default params): {recall:.4f}")
    assert recall >= 0.95
    assert all(not r.exhaustive and r.returned_k == 10 for r in res)


def test_batched_queries_equal_single_queries(engine):
    x = make_vectors(1000, 8, seed=41)
    engine.create_collection(
        T, "p", dim=8, metric=Metric.IP, index_type=IndexType.FLAT, embedder="e"
    )
    engine.upsert(T, "p", make_records(x))
    q = make_vectors(5, 8, seed=42)
    batched = engine.search(T, "p", q, 7)
    for i in range(5):
        (single,) = engine.search(T, "p", q[i], 7)
        assert [h.id for h in single.hits] == [h.id for h in batched[i].hits]
