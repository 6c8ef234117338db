"""Property test: random upserts and deletes agree with a plain dict model."""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragplane.index import Engine, Filter, IndexType, Metric, Record
from ragplane.index.types import Condition, FilterOp

from .vectors import brute_force

T = "default"
IDS = [f"k{i}" for i in range(12)]

op = st.one_of(
    st.tuples(
        st.just("upsert"),
        st.lists(st.sampled_from(IDS), min_size=1, max_size=5, unique=True),
        st.integers(0, 2**16),
    ),
    st.tuples(
        st.just("delete"), st.lists(st.sampled_from(IDS), max_size=4, unique=True), st.just(0)
    ),
    st.tuples(st.just("delete_even"), st.just([]), st.just(0)),
    st.tuples(st.just("reopen"), st.just([]), st.just(0)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=12), metric=st.sampled_from(list(Metric)))
def test_engine_matches_dict_model(ops, metric):
    with tempfile.TemporaryDirectory() as d:
        eng = Engine(d)
        try:
            eng.create_collection(
                T, "m", dim=3, metric=metric, index_type=IndexType.FLAT, embedder="e"
            )
            model: dict[str, tuple[np.ndarray, int]] = {}
            for kind, ids, seed in ops:
                if kind == "upsert":
                    rng = np.random.default_rng(seed)
                    vecs = rng.uniform(0.1, 1.0, (len(ids), 3)).astype(np.float32)
                    n = [int(x) for x in rng.integers(0, 10, len(ids))]
                    recs = [
                        Record(i, v, metadata={"n": k})
                        for i, v, k in zip(ids, vecs, n, strict=True)
                    ]
                    assert eng.upsert(T, "m", recs) == len(ids)
                    model.update({i: (v, k) for i, v, k in zip(ids, vecs, n, strict=True)})
                elif kind == "delete":
                    if ids:
                        assert eng.delete(T, "m", ids=ids) == sum(i in model for i in ids)
                        for i in ids:
                            model.pop(i, None)
                elif kind == "delete_even":
                    flt = Filter(must=(Condition("n", FilterOp.IN, [0, 2, 4, 6, 8]),))
                    gone = [i for i, (_, k) in model.items() if k % 2 == 0]
                    assert eng.delete(T, "m", filter=flt) == len(gone)
                    for i in gone:
                        del model[i]
                else:
                    eng.close()
                    eng = Engine(d)
                assert eng.describe(T, "m").count == len(model)
            live = sorted(model)
            assert [r.id for r in eng.get(T, "m", IDS)] == [i for i in IDS if i in model]
            q = np.array([[0.3, 0.5, 0.7]], np.float32)
            (res,) = eng.search(T, "m", q, 12)
            assert res.returned_k == len(live)
            if live:
                base = np.stack([model[i][0] for i in live])
                exp_s, _ = brute_force(base, q, len(live), metric)
                np.testing.assert_allclose([h.score for h in res.hits], exp_s[0], atol=1e-5)
                flt = Filter(must=(Condition("n", FilterOp.GTE, 5),))
                want = {i for i in live if model[i][1] >= 5}
                (fres,) = eng.search(T, "m", q, 12, filter=flt)
                assert {h.id for h in fres.hits} == want
        finally:
            eng.close()
