"""Every filter op (nested fields, arrays, must/should/must_not) against a Python oracle,
and filtered searches that fill top_k on approximate indexes."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.index import Filter, IndexType, Metric
from ragplane.index import search as search_mod
from ragplane.index.types import Condition, FilterOp

from .vectors import brute_force, make_records, make_vectors

T = "default"
C = Condition
N = 60


def meta(i: int) -> dict:
    m: dict = {
        "i": i,
        "f": i / 2,
        "tag": ["red", "green", "blue"][i % 3],
        "flag": i % 2 == 0,
        "author": {"name": f"a{i % 4}", "age": 20 + i % 10},
        "tags": [f"t{i % 5}", f"t{(i + 1) % 5}"],
    }
    if i % 7 == 0:
        del m["tag"]
    if i % 11 == 0:
        m["opt"] = None
    if i % 13 == 0:
        m["str_num"] = str(i)
    return m


def oracle_cond(m: dict, c: Condition) -> bool:
    cur: object = m
    present = True
    for part in c.field.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            present = False
            break

    def same(a, b):
        return type(a) is type(b) or (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and not isinstance(a, bool)
            and not isinstance(b, bool)
        )

    def eq(v):
        if not present:
            return False
        vals = cur if isinstance(cur, list) else [cur]
        return any(same(x, v) and x == v for x in vals)

    op = FilterOp(c.op)
    if op == FilterOp.EQ:
        return eq(c.value)
    if op == FilterOp.NE:
        return not eq(c.value)
    if op == FilterOp.IN:
        return any(eq(v) for v in c.value)
    if op == FilterOp.NIN:
        return not any(eq(v) for v in c.value)
    if op == FilterOp.EXISTS:
        has = present and cur is not None
        return has if c.value in (None, True) else not has
    if not present or isinstance(cur, (bool, list, dict)) or cur is None or not same(cur, c.value):
        return False
    return {
        FilterOp.GT: cur > c.value,
        FilterOp.GTE: cur >= c.value,
        FilterOp.LT: cur < c.value,
        FilterOp.LTE: cur <= c.value,
    }[op]


def oracle(m: dict, f: Filter) -> bool:
    return (
        all(oracle_cond(m, c) for c in f.must)
        and (not f.should or any(oracle_cond(m, c) for c in f.should))
        and not any(oracle_cond(m, c) for c in f.must_not)
    )


CASES = [
    Filter(must=(C("tag", FilterOp.EQ, "red"),)),
    Filter(must=(C("i", FilterOp.EQ, 5),)),
    Filter(must=(C("i", FilterOp.EQ, 5.0),)),
    Filter(must=(C("i", FilterOp.EQ, "5"),)),
    Filter(must=(C("str_num", FilterOp.EQ, "13"),)),
    Filter(must=(C("flag", FilterOp.EQ, True),)),
    Filter(must=(C("flag", FilterOp.EQ, 1),)),  # 1 is not true
    Filter(must=(C("opt", FilterOp.EQ, None),)),
    Filter(must=(C("tag", FilterOp.NE, "red"),)),  # includes items without a tag
    Filter(must=(C("tag", FilterOp.IN, ["red", "blue"]),)),
    Filter(must=(C("i", FilterOp.IN, [1, 2, "3", True]),)),
    Filter(must=(C("tag", FilterOp.IN, []),)),
    Filter(must=(C("tag", FilterOp.NIN, ["red", "blue"]),)),
    Filter(must=(C("tag", FilterOp.NIN, []),)),
    Filter(must=(C("i", FilterOp.GT, 50),)),
    Filter(must=(C("i", FilterOp.GTE, 50),)),
    Filter(must=(C("f", FilterOp.LT, 3.5),)),
    Filter(must=(C("f", FilterOp.LTE, 3.5),)),
    Filter(must=(C("tag", FilterOp.GT, "green"),)),  # strings compare with strings
    Filter(must=(C("tag", FilterOp.LT, 5),)),  # a string field never matches a number
    Filter(must=(C("tag", FilterOp.EXISTS),)),
    Filter(must=(C("tag", FilterOp.EXISTS, True),)),
    Filter(must=(C("tag", FilterOp.EXISTS, False),)),
    Filter(must=(C("opt", FilterOp.EXISTS),)),  # null counts as absent
    Filter(must=(C("author.name", FilterOp.EQ, "a1"),)),
    Filter(must=(C("author.age", FilterOp.GTE, 27),)),
    Filter(must=(C("author.missing.deeper", FilterOp.EXISTS, False),)),
    Filter(must=(C("tags", FilterOp.EQ, "t3"),)),  # array contains
    Filter(must=(C("tags", FilterOp.IN, ["t0", "t1"]),)),
    Filter(must=(C("tags", FilterOp.NE, "t0"),)),
    Filter(must=(C("author", FilterOp.EQ, "a1"),)),  # an object is not a scalar
    Filter(must=(C("tag", FilterOp.EQ, "red"), C("i", FilterOp.GT, 20))),
    Filter(should=(C("tag", FilterOp.EQ, "red"), C("i", FilterOp.LT, 5))),
    Filter(must_not=(C("tag", FilterOp.EQ, "red"), C("flag", FilterOp.EQ, True))),
    Filter(
        must=(C("author.age", FilterOp.LT, 28),),
        should=(C("tags", FilterOp.EQ, "t1"), C("tag", FilterOp.EQ, "blue")),
        must_not=(C("i", FilterOp.IN, [1, 2, 3, 4]),),
    ),
    Filter(must=(C("tag", "eq", "green"),)),  # ops given as strings work
]


@pytest.fixture
def filled(engine):
    engine.create_collection(
        T, "f", dim=4, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
    )
    engine.upsert(T, "f", make_records(make_vectors(N, 4, seed=5), metadata=meta))
    return engine


@pytest.mark.parametrize("flt", CASES, ids=[str(i) for i in range(len(CASES))])
def test_filter_ops_match_oracle(filled, flt):
    want = {f"id{i}" for i in range(N) if oracle(meta(i), flt)}
    (res,) = filled.search(T, "f", np.zeros(4, np.float32), N, filter=flt)
    assert {h.id for h in res.hits} == want
    assert res.returned_k == len(want) and res.exhaustive
    assert filled.count_matching(T, "f", flt) == len(want)


def test_filtered_results_are_the_nearest_matching(filled):
    x = make_vectors(N, 4, seed=5)
    flt = Filter(must=(C("flag", FilterOp.EQ, True),))
    keep = np.array([i for i in range(N) if i % 2 == 0])
    q = make_vectors(3, 4, seed=6)
    exp_s, exp_p = brute_force(x[keep], q, 5, Metric.L2)
    for row, r in enumerate(filled.search(T, "f", q, 5, filter=flt)):
        assert [h.id for h in r.hits] == [f"id{keep[p]}" for p in exp_p[row]]
        np.testing.assert_allclose([h.score for h in r.hits], exp_s[row], atol=1e-4)


def test_delete_by_filter_uses_same_semantics(filled):
    flt = Filter(must=(C("tags", FilterOp.EQ, "t3"),))
    want = sum(oracle(meta(i), flt) for i in range(N))
    assert filled.delete(T, "f", filter=flt) == want
    assert filled.count_matching(T, "f", flt) == 0


@pytest.mark.parametrize("kind", [IndexType.HNSW, IndexType.FLAT])
@pytest.mark.parametrize("selectivity", [0.001, 0.05, 0.3])
def test_selective_filter_fills_top_k(engine, monkeypatch, kind, selectivity):
    # a small exact-scan threshold exercises the approximate path with a selector too
    monkeypatch.setattr(search_mod, "EXACT_SCAN_MAX", 20)
    monkeypatch.setattr(search_mod, "EXACT_SCAN_FRACTION", 0.002)
    n, dim, k = 5000, 16, 10
    x = make_vectors(n, dim, seed=7)
    every = int(1 / selectivity)
    engine.create_collection(T, "s", dim=dim, metric=Metric.COSINE, index_type=kind, embedder="e")
    engine.upsert(T, "s", make_records(x, metadata=lambda i: {"hit": i % every == 0}))
    flt = Filter(must=(C("hit", FilterOp.EQ, True),))
    matching = np.arange(0, n, every)
    q = make_vectors(20, dim, seed=8)
    res = engine.search(T, "s", q, k, filter=flt)
    exp_s, exp_p = brute_force(x[matching], q, k, Metric.COSINE)
    recall = 0.0
    for row, r in enumerate(res):
        assert r.returned_k == min(k, matching.size)
        assert all(int(h.id[2:]) % every == 0 for h in r.hits)
        recall += len({h.id for h in r.hits} & {f"id{matching[p]}" for p in exp_p[row]}) / len(
            exp_p[row]
        )
        if r.exhaustive:
            np.testing.assert_allclose([h.score for h in r.hits], exp_s[row], atol=1e-5)
    assert recall / len(res) >= 0.9
    if kind == IndexType.FLAT or matching.size <= 20:
        assert all(r.exhaustive for r in res)


def test_flat_batch_under_a_selective_filter_scans_only_the_matches(engine, monkeypatch):
    # coalesced queries on a flat index: the BLAS batch would score every live row, so a
    # filter that leaves few rows is answered from those rows alone, with the same result
    x = make_vectors(3000, 16, seed=11)
    engine.create_collection(
        T, "s", dim=16, metric=Metric.COSINE, index_type=IndexType.FLAT, embedder="e"
    )
    engine.upsert(T, "s", make_records(x, metadata=lambda i: {"g": i % 100}))
    q = make_vectors(2 * search_mod.fx.BLAS_MIN_QUERIES, 16, seed=12)
    flt = Filter(must=(C("g", FilterOp.EQ, 3),))

    def full_scan(*a, **kw):
        raise AssertionError("a selective filter must not scan every row")

    monkeypatch.setattr(search_mod.fx, "flat_batch_search", full_scan)
    res = engine.search(T, "s", q, 5, filter=flt)
    matching = np.arange(3, 3000, 100)
    exp_s, exp_p = brute_force(x[matching], q, 5, Metric.COSINE)
    for row, r in enumerate(res):
        assert r.exhaustive
        assert [h.id for h in r.hits] == [f"id{matching[p]}" for p in exp_p[row]]
        np.testing.assert_allclose([h.score for h in r.hits], exp_s[row], atol=1e-5)
    monkeypatch.undo()
    (unfiltered,) = engine.search(T, "s", q[:1], 5)  # no filter: the index as before
    assert unfiltered.exhaustive and unfiltered.returned_k == 5


def test_hnsw_short_filter_falls_back_to_exact(engine):
    # 12 matches among 3000 on hnsw: the exact scan answers, so results fill and are exact
    x = make_vectors(3000, 8, seed=9)
    engine.create_collection(
        T, "s", dim=8, metric=Metric.IP, index_type=IndexType.HNSW, embedder="e"
    )
    engine.upsert(T, "s", make_records(x, metadata=lambda i: {"g": i % 250}))
    (res,) = engine.search(T, "s", x[0], 20, filter=Filter(must=(C("g", FilterOp.EQ, 0),)))
    assert res.returned_k == 12 and res.exhaustive


def test_filter_excludes_tombstoned_versions(engine):
    engine.create_collection(
        T, "s", dim=4, metric=Metric.L2, index_type=IndexType.HNSW, embedder="e"
    )
    x = make_vectors(50, 4, seed=10)
    engine.upsert(T, "s", make_records(x, metadata=lambda i: {"v": 1}))
    engine.upsert(T, "s", make_records(x[:10], metadata=lambda i: {"v": 2}))
    (res,) = engine.search(T, "s", x[0], 50, filter=Filter(must=(C("v", FilterOp.EQ, 1),)))
    assert res.returned_k == 40
    assert {h.id for h in res.hits} == {f"id{i}" for i in range(10, 50)}


def test_repeated_filter_sees_new_writes(engine):
    # filter results are cached per collection; any write must invalidate them
    engine.create_collection(
        T, "s", dim=4, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
    )
    x = make_vectors(20, 4, seed=11)
    engine.upsert(T, "s", make_records(x, metadata=lambda i: {"k": i % 2}))
    flt = Filter(must=(C("k", FilterOp.EQ, 1),))
    assert engine.count_matching(T, "s", flt) == 10
    assert engine.search(T, "s", x[0], 50, filter=flt)[0].returned_k == 10
    engine.upsert(T, "s", make_records(x[:1], prefix="new", metadata=lambda i: {"k": 1}))
    assert engine.search(T, "s", x[0], 50, filter=flt)[0].returned_k == 11
    engine.upsert(T, "s", make_records(x[:1], prefix="new", metadata=lambda i: {"k": 0}))
    engine.delete(T, "s", ids=["id1"])
    (res,) = engine.search(T, "s", x[0], 50, filter=flt)
    assert res.returned_k == 9 and {"new0", "id1"}.isdisjoint(h.id for h in res.hits)
    assert engine.count_matching(T, "s", flt) == 9
