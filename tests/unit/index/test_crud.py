from __future__ import annotations

import numpy as np
import pytest

from ragplane.core.errors import AlreadyExists, NotFound
from ragplane.index import Engine, Filter, IndexParams, IndexType, Metric, Record
from ragplane.index.types import Condition, FilterOp

from .vectors import make_records, make_vectors, normalise

T = "default"


def _create(
    engine: Engine, name: str = "docs", dim: int = 8, metric=Metric.L2, index_type=IndexType.FLAT
):
    return engine.create_collection(
        T, name, dim=dim, metric=metric, index_type=index_type, embedder="fake@1"
    )


def test_create_list_describe_delete(engine):
    info = _create(engine, "b", dim=4)
    assert (info.name, info.dim, info.generation, info.count) == ("b", 4, 1, 0)
    _create(engine, "a", dim=4, metric=Metric.COSINE, index_type=IndexType.HNSW)
    assert [c.name for c in engine.list_collections(T)] == ["a", "b"]
    assert engine.list_collections("other") == []
    hnsw = engine.describe(T, "a")
    assert hnsw.index_type == IndexType.HNSW and hnsw.params.hnsw_m > 0
    with pytest.raises(AlreadyExists, match="already exists"):
        _create(engine, "a", dim=4)
    engine.delete_collection(T, "a")
    with pytest.raises(NotFound, match="'a' does not exist"):
        engine.describe(T, "a")
    with pytest.raises(NotFound):
        engine.delete_collection(T, "a")
    _create(engine, "a", dim=4)  # the name is free again
    assert engine.describe(T, "a").count == 0


def test_tenants_are_separate(engine):
    for tenant in ("t1", "t2"):
        engine.create_collection(
            tenant, "c", dim=2, metric=Metric.IP, index_type=IndexType.FLAT, embedder="e"
        )
    engine.upsert("t1", "c", [Record("x", np.ones(2, np.float32))])
    assert engine.describe("t1", "c").count == 1
    assert engine.describe("t2", "c").count == 0
    assert engine.get("t2", "c", ["x"]) == []


def test_upsert_get_and_replace(engine):
    _create(engine)
    x = make_vectors(10, 8)
    assert engine.upsert(T, "docs", make_records(x)) == 10
    got = engine.get(T, "docs", ["id3", "missing", "id1"], include_vectors=True)
    assert [r.id for r in got] == ["id3", "id1"]  # request order, missing left out
    np.testing.assert_array_equal(got[0].vector, x[3])
    assert got[0].text == "text 3" and got[0].metadata == {"i": 3}
    assert engine.get(T, "docs", ["id3"])[0].vector is None

    new = np.full(8, 7.0, np.float32)
    engine.upsert(T, "docs", [Record("id3", new, "replaced", {"v": 2})])
    info = engine.describe(T, "docs")
    assert (info.count, info.tombstones) == (10, 1)
    (rec,) = engine.get(T, "docs", ["id3"], include_vectors=True)
    assert rec.text == "replaced" and rec.metadata == {"v": 2}
    np.testing.assert_array_equal(rec.vector, new)
    # the old vector no longer answers searches; the new one does
    res = engine.search(T, "docs", np.stack([x[3], new]), 10)
    assert "id3" not in [h.id for h in res[0].hits[:1]]
    assert res[1].hits[0].id == "id3" and res[1].hits[0].score == pytest.approx(0.0, abs=1e-4)
    assert len({h.id for h in res[0].hits}) == 10  # no duplicate ids from the tombstone


def test_cosine_vectors_are_normalised(engine):
    _create(engine, metric=Metric.COSINE)
    v = np.arange(1, 9, dtype=np.float32)
    engine.upsert(T, "docs", [Record("a", v)])
    (rec,) = engine.get(T, "docs", ["a"], include_vectors=True)
    np.testing.assert_allclose(rec.vector, normalise(v), rtol=1e-6)
    (res,) = engine.search(T, "docs", v * 10, 1)
    assert res.hits[0].score == pytest.approx(1.0, abs=1e-5)


def test_delete_by_ids_and_filter_are_tombstones(engine):
    _create(engine)
    x = make_vectors(20, 8, seed=1)
    engine.upsert(T, "docs", make_records(x, metadata=lambda i: {"even": i % 2 == 0}))
    assert engine.delete(T, "docs", ids=["id0", "id1", "nope"]) == 2
    assert (
        engine.delete(T, "docs", filter=Filter(must=(Condition("even", FilterOp.EQ, True),))) == 9
    )
    info = engine.describe(T, "docs")
    assert (info.count, info.tombstones) == (9, 11)
    # what a scan reads (the coalescer's measure): the live vectors and the deleted ones
    assert engine.scan_size(T, "docs") == info.chunks + info.tombstones == 20
    engine.upsert(T, "docs", make_records(x[:3]))  # two back from the dead, one replaced
    info = engine.describe(T, "docs")
    assert engine.scan_size(T, "docs") == info.chunks + info.tombstones == 23
    engine.upsert(T, "docs", make_records(x[1:2]))
    engine.delete(T, "docs", ids=["id0", "id1", "id2"])
    info = engine.describe(T, "docs")
    assert (info.count, info.tombstones) == (9, 15)
    assert engine.scan_size(T, "docs") == 24
    with pytest.raises(NotFound, match="'gone' does not exist"):
        engine.scan_size(T, "gone")
    res = engine.search(T, "docs", x, 20)
    for r in res:
        assert r.returned_k == 9
        assert all(int(h.id[2:]) % 2 == 1 for h in r.hits)
    assert engine.get(T, "docs", ["id0", "id2"]) == []
    # deleting again is a no-op
    assert engine.delete(T, "docs", ids=["id0"]) == 0


def test_search_include_text_and_metadata(engine):
    _create(engine)
    x = make_vectors(5, 8, seed=2)
    engine.upsert(T, "docs", make_records(x, metadata=lambda i: {"n": {"deep": i}}))
    (bare,) = engine.search(T, "docs", x[2], 1)
    assert bare.hits[0].text == "" and bare.hits[0].metadata == {}
    (full,) = engine.search(T, "docs", x[2], 1, include_text=True, include_metadata=True)
    assert full.hits[0].id == "id2"
    assert full.hits[0].text == "text 2" and full.hits[0].metadata == {"n": {"deep": 2}}


def test_search_on_empty_collection_and_top_k_above_count(engine):
    _create(engine)
    (res,) = engine.search(T, "docs", np.zeros(8, np.float32), 5)
    assert (res.returned_k, list(res.hits), res.exhaustive) == (0, [], True)
    engine.upsert(T, "docs", make_records(make_vectors(3, 8)))
    (res,) = engine.search(T, "docs", np.zeros(8, np.float32), 10)
    assert res.returned_k == 3


def test_iter_records_stable_order_live_only(engine):
    _create(engine)
    x = make_vectors(25, 8, seed=3)
    engine.upsert(T, "docs", make_records(x))
    engine.delete(T, "docs", ids=["id4"])
    engine.upsert(T, "docs", [Record("id0", x[0], "again")])
    batches = list(engine.iter_records(T, "docs", batch=10))
    assert [len(b) for b in batches] == [10, 10, 4]
    ids = [r.id for b in batches for r in b]
    assert ids == [f"id{i}" for i in range(1, 25) if i != 4] + ["id0"]
    assert all(r.vector is not None and r.vector.shape == (8,) for b in batches for r in b)


def test_set_embedder_and_params_round_trip(engine):
    p = IndexParams(hnsw_m=8, hnsw_ef_search=40)
    engine.create_collection(
        T, "h", dim=4, metric=Metric.IP, index_type=IndexType.HNSW, embedder="a@1", params=p
    )
    info = engine.describe(T, "h")
    assert (
        info.params.hnsw_m == 8
        and info.params.hnsw_ef_search == 40
        and info.params.hnsw_ef_construction > 0
    )
    engine.set_embedder(T, "h", "b@2")
    assert engine.describe(T, "h").embedder == "b@2"


def test_count_matching(engine):
    _create(engine)
    engine.upsert(T, "docs", make_records(make_vectors(10, 8), metadata=lambda i: {"i": i}))
    assert engine.count_matching(T, "docs", None) == 10
    assert engine.count_matching(T, "docs", Filter(must=(Condition("i", FilterOp.GTE, 7),))) == 3


def test_upsert_batch_is_one_transaction(engine):
    # a bad item anywhere refuses the whole batch: nothing of it is written
    _create(engine)
    recs = make_records(make_vectors(5, 8))
    recs[3] = Record("id3", np.full(8, np.nan, np.float32))
    with pytest.raises(Exception, match="item 3"):
        engine.upsert(T, "docs", recs)
    assert engine.describe(T, "docs").count == 0
