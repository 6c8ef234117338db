"""Per-request search parameters (SearchKnobs): recall moves with ef_search and nprobe,
`exact` is brute force whatever the index, and values that do not apply are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.index import Engine, IndexParams, IndexType, Metric
from ragplane.index.types import Quantization, SearchKnobs

from .vectors import brute_force, embedding_like, make_records

T = "default"
DIM = 48


def recall_at_10(eng: Engine, name: str, base: np.ndarray, queries: np.ndarray,
                 knobs: SearchKnobs | None = None) -> float:
    """Mean recall@10 of the engine's answers for held-out `queries` against brute force."""
    _, truth = brute_force(base, queries, 10, Metric.COSINE)
    got = eng.search(T, name, queries, 10, knobs=knobs)
    hits = sum(
        len({h.id for h in r.hits} & {f"id{p}" for p in row})
        for r, row in zip(got, truth, strict=True)
    )
    return hits / (10 * len(queries))


def _collection(
    eng: Engine, name: str, kind: IndexType, n: int, params: IndexParams | None = None
) -> np.ndarray:
    eng.create_collection(T, name, dim=DIM, metric=Metric.COSINE, index_type=kind,
                          embedder="e@1", params=params or IndexParams())
    x = embedding_like(n, DIM, seed=1)
    recs = make_records(x)
    for lo in range(0, n, 2000):
        eng.upsert(T, name, recs[lo : lo + 2000])
    return x


@pytest.fixture(scope="module")
def hnsw(tmp_path_factory):
    """An HNSW collection of 6,000 embedding-like vectors, with a sparse graph (m 8) so
    that the search's candidate list decides recall."""
    eng = Engine(tmp_path_factory.mktemp("knobs") / "data")
    x = _collection(eng, "h", IndexType.HNSW, 6000, IndexParams(hnsw_m=8, hnsw_ef_construction=40))
    yield eng, x
    eng.close()


QUERIES = embedding_like(200, DIM, seed=2)  # held out: never indexed


def test_recall_rises_with_ef_search(hnsw):
    eng, x = hnsw
    curve = {ef: recall_at_10(eng, "h", x, QUERIES, SearchKnobs(ef_search=ef))
             for ef in (10, 20, 40, 80, 320)}
    print("recall@10 by ef_search:", curve)  # noqa: T201 - the table in the report
    values = list(curve.values())
    assert all(b >= a - 0.005 for a, b in zip(values, values[1:], strict=False)), curve
    assert curve[10] < 0.95 and curve[320] >= 0.99 and curve[320] - curve[10] >= 0.05, curve
    # unset = the collection's default (hnsw_ef_search 128)
    assert recall_at_10(eng, "h", x, QUERIES) == recall_at_10(
        eng, "h", x, QUERIES, SearchKnobs(ef_search=128))


def test_exact_is_brute_force_whatever_the_index(hnsw):
    eng, x = hnsw
    exp_s, exp_p = brute_force(x, QUERIES[:20], 10, Metric.COSINE)
    res = eng.search(T, "h", QUERIES[:20], 10, knobs=SearchKnobs(exact=True))
    for r, ids, scores in zip(res, exp_p, exp_s, strict=True):
        assert r.exhaustive
        assert [h.id for h in r.hits] == [f"id{p}" for p in ids]
        np.testing.assert_allclose([h.score for h in r.hits], scores, atol=1e-5)
    assert not eng.search(T, "h", QUERIES[:1], 10)[0].exhaustive


def test_nprobe_trades_recall_on_ivf_pq(engine):
    x = _collection(engine, "p", IndexType.IVF_PQ, 4000)
    engine.rebuild(T, "p", min_recall=0)
    nlist = engine.describe(T, "p").params.ivf_nlist
    low = recall_at_10(engine, "p", x, QUERIES, SearchKnobs(nprobe=1))
    high = recall_at_10(engine, "p", x, QUERIES, SearchKnobs(nprobe=nlist))
    assert low + 0.1 < high and high >= 0.95, (low, high)
    exact = engine.search(T, "p", QUERIES[:5], 10, knobs=SearchKnobs(exact=True))
    _, exp_p = brute_force(x, QUERIES[:5], 10, Metric.COSINE)
    assert [[h.id for h in r.hits] for r in exact] == [[f"id{p}" for p in row] for row in exp_p]


@pytest.mark.parametrize(
    "name,knobs,message",
    [
        ("f", SearchKnobs(ef_search=64), r"ef_search applies to hnsw collections; .* 'f' is flat"),
        ("h", SearchKnobs(nprobe=4), r"nprobe applies to ivf_pq collections; .* 'h' is hnsw"),
        ("h", SearchKnobs(ef_search=-1), r"ef_search must be from 1 to 10000, got -1"),
        ("h", SearchKnobs(ef_search=0), r"ef_search must be from 1 to 10000, got 0"),
        ("h", SearchKnobs(ef_search=20_000), r"ef_search must be from 1 to 10000"),
        ("h", SearchKnobs(oversampling=2.0), r"oversampling applies to quantized and ivf_pq"),
        ("q", SearchKnobs(oversampling=0.5), r"oversampling must be from 1 to 100, got 0.5"),
        ("q", SearchKnobs(oversampling=math.nan), r"oversampling must be from 1 to 100"),
        ("h", SearchKnobs(exact=True, ef_search=64), r"leave ef_search, nprobe and oversampling"),
        ("p", SearchKnobs(nprobe=10_000), r"nprobe 10000 is more than the \d+ inverted lists"),
        ("p", SearchKnobs(nprobe=-3), r"nprobe must be from 1"),
    ],
)
def test_knobs_that_do_not_apply_are_refused(kinds, name, knobs, message):
    with pytest.raises(InvalidArgument, match=message):
        kinds.search(T, name, QUERIES[:1], 10, knobs=knobs)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """A collection of each kind: flat, hnsw, int8-quantized hnsw and trained ivf_pq."""
    eng = Engine(tmp_path_factory.mktemp("kinds") / "data")
    for coll, kind, params in (
        ("f", IndexType.FLAT, IndexParams()),
        ("h", IndexType.HNSW, IndexParams()),
        ("q", IndexType.HNSW, IndexParams(quantization=Quantization.INT8)),
        ("p", IndexType.IVF_PQ, IndexParams()),
    ):
        eng.create_collection(T, coll, dim=DIM, metric=Metric.COSINE, index_type=kind,
                              embedder="e@1", params=params)
    eng.upsert(T, "p", make_records(embedding_like(3000, DIM, seed=1)))
    eng.rebuild(T, "p", min_recall=0)  # trained: nlist is known
    yield eng
    eng.close()
