from __future__ import annotations

import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument, NotFound
from ragplane.index import Filter, IndexParams, IndexType, Metric, Record
from ragplane.index.types import Condition, FilterOp
from ragplane.index.validate import unit_rows

T = "default"


@pytest.fixture
def coll(engine):
    engine.create_collection(
        T, "c", dim=4, metric=Metric.COSINE, index_type=IndexType.FLAT, embedder="e"
    )
    engine.upsert(T, "c", [Record("a", np.ones(4, np.float32), metadata={"x": 1})])
    return engine


@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "semi;colon", "ü"])
def test_bad_collection_names(engine, name):
    with pytest.raises(InvalidArgument, match="collection name"):
        engine.create_collection(
            T, name, dim=4, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
        )


def test_good_collection_name_edges(engine):
    engine.create_collection(
        T, "A-b_c.9" + "x" * 121, dim=1, metric="l2", index_type="flat", embedder="e"
    )


@pytest.mark.parametrize("dim", [0, -1, 65537, 2.5, True])
def test_bad_dim(engine, dim):
    with pytest.raises(InvalidArgument, match="dim must be"):
        engine.create_collection(
            T, "c", dim=dim, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
        )


def test_unknown_metric_and_index_type(engine):
    with pytest.raises(
        InvalidArgument, match="unknown metric 'dot'; expected one of cosine, ip, l2"
    ):
        engine.create_collection(
            T, "c", dim=4, metric="dot", index_type=IndexType.FLAT, embedder="e"
        )
    with pytest.raises(InvalidArgument, match="unknown index_type 'lsh'"):
        engine.create_collection(T, "c", dim=4, metric=Metric.L2, index_type="lsh", embedder="e")
    with pytest.raises(InvalidArgument, match="pq_m 3 must divide"):
        engine.create_collection(
            T,
            "c",
            dim=4,
            metric=Metric.L2,
            index_type=IndexType.IVF_PQ,
            embedder="e",
            params=IndexParams(pq_m=3),
        )


def test_unknown_collection(engine):
    with pytest.raises(NotFound, match="'nope' does not exist"):
        engine.search(T, "nope", np.ones(4), 1)
    for call in (
        lambda: engine.upsert(T, "nope", [Record("a", np.ones(4))]),
        lambda: engine.get(T, "nope", ["a"]),
        lambda: engine.delete(T, "nope", ids=["a"]),
        lambda: engine.describe(T, "nope"),
        lambda: engine.rebuild(T, "nope"),
    ):
        with pytest.raises(NotFound):
            call()


def test_upsert_validation(coll):
    with pytest.raises(InvalidArgument, match="records is empty"):
        coll.upsert(T, "c", [])
    with pytest.raises(
        InvalidArgument,
        match=r"item 1 \(id 'b'\): vector has dimension 3, collection 'c' expects 4",
    ):
        coll.upsert(T, "c", [Record("a", np.ones(4)), Record("b", np.ones(3))])
    with pytest.raises(InvalidArgument, match="item 0 .*NaN or infinity"):
        coll.upsert(T, "c", [Record("a", np.array([1, np.inf, 0, 0]))])
    with pytest.raises(InvalidArgument, match="item 0 .*NaN"):
        coll.upsert(T, "c", [Record("a", np.array([1, np.nan, 0, 0]))])
    with pytest.raises(InvalidArgument, match="item 1: id 'a' appears more than once"):
        coll.upsert(T, "c", [Record("a", np.ones(4)), Record("a", np.ones(4))])
    with pytest.raises(InvalidArgument, match="item 0 has an empty id"):
        coll.upsert(T, "c", [Record("", np.ones(4))])
    with pytest.raises(InvalidArgument, match="has no vector"):
        coll.upsert(T, "c", [Record("a", None)])
    with pytest.raises(InvalidArgument, match="zero vector"):
        coll.upsert(T, "c", [Record("a", np.zeros(4))])
    with pytest.raises(InvalidArgument, match="metadata is not a JSON object"):
        coll.upsert(T, "c", [Record("a", np.ones(4), metadata={"x": object()})])
    with pytest.raises(InvalidArgument, match="metadata is not a JSON object"):
        coll.upsert(T, "c", [Record("a", np.ones(4), metadata={"x": float("nan")})])
    assert coll.describe(T, "c").count == 1


@pytest.mark.parametrize("k", [0, -1, 10_001, 1.5, True])
def test_bad_top_k(coll, k):
    with pytest.raises(InvalidArgument, match="top_k must be from 1 to 10000"):
        coll.search(T, "c", np.ones(4), k)


def test_query_validation(coll):
    with pytest.raises(InvalidArgument, match="query has dimension 5, collection 'c' expects 4"):
        coll.search(T, "c", np.ones(5), 1)
    with pytest.raises(InvalidArgument, match="NaN or infinity"):
        coll.search(T, "c", np.array([1, np.nan, 0, 0]), 1)
    with pytest.raises(InvalidArgument, match="non-empty"):
        coll.search(T, "c", np.zeros((0, 4)), 1)
    with pytest.raises(InvalidArgument, match="zero query"):
        coll.search(T, "c", np.zeros(4), 1)


@pytest.mark.parametrize(
    ("cond", "message"),
    [
        (Condition("x", "like", 1), r"must\[0\] \(field 'x'\): unknown op 'like'"),
        (Condition("x", FilterOp.IN, 1), r"op 'in' needs a list of values, got int"),
        (Condition("x", FilterOp.NIN, "ab"), r"op 'nin' needs a list"),
        (Condition("x", FilterOp.GT, [1]), r"op 'gt' compares numbers or strings; got list"),
        (Condition("x", FilterOp.LTE, {"a": 1}), r"op 'lte' compares numbers or strings"),
        (Condition("x", FilterOp.GTE, True), r"op 'gte' compares numbers or strings; got bool"),
        (Condition("", FilterOp.EQ, 1), r"field name is empty"),
        (Condition("a..b", FilterOp.EQ, 1), r"empty path segment"),
        (Condition('a"b', FilterOp.EQ, 1), r"quotes"),
        (Condition("x", FilterOp.EQ, [1]), r"value \[1\] is a list"),
        (Condition("x", FilterOp.EXISTS, "yes"), r"exists' takes true or false"),
        (Condition("x", FilterOp.EQ, float("nan")), r"not a finite number"),
    ],
)
def test_malformed_filters(coll, cond, message):
    flt = Filter(must=(cond,))
    with pytest.raises(InvalidArgument, match=message):
        coll.search(T, "c", np.ones(4), 1, filter=flt)
    with pytest.raises(InvalidArgument, match=message):
        coll.delete(T, "c", filter=flt)
    with pytest.raises(InvalidArgument, match=message):
        coll.count_matching(T, "c", flt)


def test_malformed_filter_names_section_and_position(coll):
    flt = Filter(
        must=(Condition("x", FilterOp.EQ, 1),),
        must_not=(Condition("y", FilterOp.EQ, 1), Condition("z", "?")),
    )
    with pytest.raises(InvalidArgument, match=r"must_not\[1\] \(field 'z'\)"):
        coll.search(T, "c", np.ones(4), 1, filter=flt)


def test_delete_needs_ids_or_filter(coll):
    with pytest.raises(InvalidArgument, match="either ids or a filter"):
        coll.delete(T, "c")
    with pytest.raises(InvalidArgument, match="either ids or a filter"):
        coll.delete(T, "c", ids=["a"], filter=Filter(must=(Condition("x", FilterOp.EQ, 1),)))
    with pytest.raises(InvalidArgument, match="empty filter would delete everything"):
        coll.delete(T, "c", filter=Filter())
    assert coll.describe(T, "c").count == 1


def test_closed_engine_refuses(tmp_path):
    from ragplane.core.errors import Unavailable
    from ragplane.index import Engine

    eng = Engine(tmp_path / "d")
    eng.close()
    eng.close()  # idempotent
    with pytest.raises(Unavailable):
        eng.list_collections(T)


@pytest.mark.parametrize("metric", [Metric.COSINE, Metric.L2, Metric.IP])
def test_one_query_row_checked_as_a_batch_row_is(metric):
    """A single row (a search's query) is checked by its sum of squares; it must say what
    the row-by-row check of a batch says: the same bad rows, the same normalised vector."""
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(8).astype(np.float32) * s for s in (1e-20, 1e-3, 1, 1e19)]
    for value in (np.nan, np.inf, -np.inf):
        bad = rng.standard_normal(8).astype(np.float32)
        bad[5] = value
        rows.append(bad)
    rows.append(np.zeros(8, np.float32))
    for row in rows:
        with np.errstate(over="ignore"):  # 1e19: its squares overflow float32, both ways
            alone, bad_alone = unit_rows(row[None, :], metric)
            # in a batch of two, a fine row first: the full check runs on both
            batch, bad_batch = unit_rows(np.stack([np.ones(8, np.float32), row]), metric)
        assert bad_alone == (None if bad_batch is None else bad_batch - 1), row
        if bad_alone is None:
            np.testing.assert_allclose(alone[0], batch[1], rtol=1e-6)
            if metric == Metric.COSINE and np.dot(row, row.astype(np.float64)) < 3e38:
                assert abs(float(np.linalg.norm(alone[0])) - 1) < 1e-6
