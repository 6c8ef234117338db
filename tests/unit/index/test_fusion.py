"""Reciprocal rank fusion and weighted normalised fusion, against hand-computed values."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragplane.core.errors import InvalidArgument
from ragplane.index.fusion import check, fuse, fuse_rows
from ragplane.index.types import Fusion, FusionMethod

RRF = Fusion(method=FusionMethod.RRF)
WEIGHTED = Fusion(method=FusionMethod.WEIGHTED)


def test_rrf_matches_the_formula():
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    lexical = [("c", 12.0), ("d", 3.0)]
    out = {f.id: f for f in fuse(dense, lexical, RRF)}
    assert out["a"].score == pytest.approx(1 / 61)
    assert out["b"].score == pytest.approx(1 / 62)
    assert out["c"].score == pytest.approx(1 / 63 + 1 / 61)
    assert out["d"].score == pytest.approx(1 / 62)
    assert [f.id for f in fuse(dense, lexical, RRF)] == ["c", "a", "b", "d"]  # b = d: by id
    c = out["c"]
    assert (c.dense, c.lexical, c.dense_rank, c.lexical_rank) == (0.1, 12.0, 3, 1)
    assert (out["a"].lexical, out["a"].lexical_rank) == (None, None)
    assert (out["d"].dense, out["d"].dense_rank) == (None, None)


def test_rrf_k_and_weight():
    dense, lexical = [("a", 1.0)], [("b", 1.0)]
    out = {f.id: f.score for f in fuse(dense, lexical, Fusion(FusionMethod.RRF, 1, 0.75))}
    assert out["a"] == pytest.approx(1.5 / 2)
    assert out["b"] == pytest.approx(0.5 / 2)
    only_lexical = fuse(dense, lexical, Fusion(dense_weight=0.0))
    assert [f.id for f in only_lexical][0] == "b" and only_lexical[1].score == 0.0


def test_weighted_normalises_each_ranking():
    dense = [("a", 0.9), ("b", 0.5), ("c", 0.1)]
    lexical = [("c", 20.0), ("b", 10.0), ("d", 0.0)]
    out = {f.id: f.score for f in fuse(dense, lexical, WEIGHTED)}
    assert out == pytest.approx({"a": 0.5, "b": 0.5 * 0.5 + 0.5 * 0.5, "c": 0.5, "d": 0.0})
    out = {f.id: f.score for f in fuse(dense, lexical, Fusion(FusionMethod.WEIGHTED, 60, 0.8))}
    assert out["a"] == pytest.approx(0.8) and out["c"] == pytest.approx(0.2)


def test_weighted_equal_scores_normalise_to_one():
    out = fuse([("a", 0.3), ("b", 0.3)], [], WEIGHTED)
    assert [(f.id, f.score) for f in out] == [("a", 0.5), ("b", 0.5)]


def test_empty_inputs_and_top_k():
    assert fuse([], [], RRF) == []
    out = fuse([(f"i{n}", float(n)) for n in range(10)], [("x", 1.0)], RRF, top_k=3)
    assert [f.id for f in out] == ["i9", "x", "i8"]


def test_repeated_id_keeps_its_best_score():
    out = fuse([("a", 0.1), ("a", 0.7), ("b", 0.5)], [], RRF)
    assert [(f.id, f.dense, f.dense_rank) for f in out] == [("a", 0.7, 1), ("b", 0.5, 2)]


@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-5, 5)), max_size=12),
    st.lists(st.tuples(st.sampled_from("defghijk"), st.floats(0, 50)), max_size=12),
    st.sampled_from([RRF, WEIGHTED, Fusion(FusionMethod.RRF, 1, 0.3)]),
    st.randoms(use_true_random=False),
)
def test_fused_order_is_deterministic_and_complete(dense, lexical, fusion, rnd: random.Random):
    out = fuse(dense, lexical, fusion)
    shuffled_d, shuffled_l = dense[:], lexical[:]
    rnd.shuffle(shuffled_d)
    rnd.shuffle(shuffled_l)
    assert fuse(shuffled_d, shuffled_l, fusion) == out  # input order never matters
    assert {f.id for f in out} == {i for i, _ in dense} | {i for i, _ in lexical}
    keys = [(-f.score, f.id) for f in out]
    assert keys == sorted(keys)
    assert all(math.isfinite(f.score) and f.score >= 0 for f in out)
    if fusion.method is FusionMethod.WEIGHTED:
        assert all(f.score <= 1.0 + 1e-12 for f in out)


@pytest.mark.parametrize(
    "bad",
    [
        Fusion(rrf_k=0),
        Fusion(rrf_k=-3),
        Fusion(rrf_k=10**7),
        Fusion(dense_weight=-0.1),
        Fusion(dense_weight=1.5),
        Fusion(dense_weight=float("nan")),
    ],
)
def test_bad_parameters_are_invalid_argument(bad):
    with pytest.raises(InvalidArgument, match="fusion"):
        check(bad)


def test_good_parameters_pass():
    for good in (RRF, WEIGHTED, Fusion(rrf_k=1, dense_weight=0.0), Fusion(dense_weight=1.0)):
        assert check(good) is good


@pytest.mark.parametrize("fusion", [RRF, WEIGHTED, Fusion(FusionMethod.RRF, 7, 0.3),
                                    Fusion(FusionMethod.WEIGHTED, 60, 0.8),
                                    Fusion(dense_weight=0.0)])
def test_rows_fuse_in_arrays_as_fuse_fuses_them(fusion):
    # hybrid search over chunks fuses rows keyed (item id, seq) with fuse_rows; it must be
    # fuse exactly: candidates, scores, ranks and order, ties (by item, then seq) included
    rnd = random.Random(5)
    for _ in range(200):
        seqs = rnd.sample(range(1, 500), rnd.randint(0, 60))
        items = {s: f"item{rnd.randint(0, 12):02d}" for s in seqs}

        def ranking(items=items, seqs=seqs):
            chosen = rnd.sample(seqs, rnd.randint(0, len(seqs)))
            return [(s, items[s], float(rnd.randint(0, 5)) / 4) for s in chosen]

        dense, lexical = ranking(), ranking()
        want = fuse([((i, s), x) for s, i, x in dense], [((i, s), x) for s, i, x in lexical],
                    fusion)
        got = fuse_rows(dense, lexical, fusion)
        assert got.all() == want
        assert got.rows() == [(f.id[1], f.id[0], f.score) for f in want]
