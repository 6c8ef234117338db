"""The lexical index in the store: written with the items, searched by BM25, fused with the
dense ranking; deletes, replacements, compaction, rebuilds, snapshots and dropped
collections keep it equal to a fresh index of the live items."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.core.errors import FailedPrecondition, InvalidArgument, NotFound
from ragplane.index import Engine, IndexType, Metric, Record
from ragplane.index.types import Condition, Filter, FilterOp, Fusion, FusionMethod
from ragplane.testkit.texts import corpus
from tests.lexical_consistency import assert_lexical_matches_items

T = "tenant"
DIM = 16
IDENTIFIERS = ["SSL_CTX_set_options", "E1102", "os.path.commonpath", "zlib_rs", "Ωmega_42"]


def _vec(rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=DIM).astype(np.float32)


@pytest.fixture
def filled(engine: Engine):
    """400 real passages plus five with identifiers, random vectors, a `group` field."""
    rng = np.random.default_rng(7)
    engine.create_collection(
        T, "c", dim=DIM, metric=Metric.COSINE, index_type=IndexType.FLAT, embedder=""
    )
    texts = corpus(400)
    records = [Record(f"p{i}", _vec(rng), t, {"group": i % 4}) for i, t in enumerate(texts)]
    records += [
        Record(f"id{i}", _vec(rng), f"to fix it, call {ident} first", {"group": i % 4})
        for i, ident in enumerate(IDENTIFIERS)
    ]
    engine.upsert(T, "c", records)
    return engine


@pytest.mark.parametrize("i", range(len(IDENTIFIERS)))
def test_exact_tokens_are_recalled_first(filled, i):
    res = filled.search_lexical(T, "c", IDENTIFIERS[i], 5, include_text=True)
    assert res.hits[0].id == f"id{i}" and IDENTIFIERS[i] in res.hits[0].text
    assert res.exhaustive and res.returned_k == len(res.hits)
    h = res.hits[0]
    assert h.lexical == h.score > 0 and h.dense is None and h.fused is None


def test_scores_are_ordered_and_a_word_nobody_has_finds_nothing(filled):
    res = filled.search_lexical(T, "c", "function argument default", 50)
    scores = [h.score for h in res.hits]
    assert len(scores) == 50 and scores == sorted(scores, reverse=True)
    empty = filled.search_lexical(T, "c", "xyzzyplugh", 10)
    assert (empty.hits, empty.returned_k, empty.exhaustive) == ((), 0, True) or not empty.hits
    assert filled.search_lexical(T, "c", "?!", 10).returned_k == 0


def test_deletes_and_replacements_vanish_from_lexical_results(filled, tmp_path):
    filled.delete(T, "c", ids=["id0"])
    assert "id0" not in {
        h.id for h in filled.search_lexical(T, "c", "SSL_CTX_set_options", 10).hits
    }
    filled.delete(T, "c", filter=Filter(must=(Condition("group", FilterOp.EQ, 1),)))
    left = filled.search_lexical(T, "c", "E1102", 10).hits
    assert "id1" not in {h.id for h in left}
    rng = np.random.default_rng(1)
    filled.upsert(T, "c", [Record("id2", _vec(rng), "now it speaks of platypuses", {})])
    assert not filled.search_lexical(T, "c", "commonpath", 10).hits
    assert [h.id for h in filled.search_lexical(T, "c", "platypuses", 10).hits] == ["id2"]
    assert_lexical_matches_items(tmp_path / "data")


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_filters_apply_in_every_mode(filled, mode):
    flt = Filter(must=(Condition("group", FilterOp.EQ, 2),))
    q = np.ones(DIM, np.float32)
    text = "the function returns a list of strings"
    if mode == "dense":
        res = filled.search(T, "c", q, 30, filter=flt, include_metadata=True)[0]
    elif mode == "lexical":
        res = filled.search_lexical(T, "c", text, 30, filter=flt, include_metadata=True)
    else:
        res = filled.search_hybrid(T, "c", text, q, 30, filter=flt, include_metadata=True)
    assert res.returned_k == len(res.hits) == 30
    assert all(h.metadata["group"] == 2 for h in res.hits)
    # a filter that leaves two items: honestly two, exactly those, exhaustive
    few = Filter(must=(Condition("group", FilterOp.EQ, 3), Condition("n", FilterOp.EXISTS)))
    rng = np.random.default_rng(3)
    filled.upsert(
        T,
        "c",
        [
            Record(f"few{i}", _vec(rng), "the function returns", {"group": 3, "n": i})
            for i in range(2)
        ],
    )
    if mode == "dense":
        res = filled.search(T, "c", q, 30, filter=few)[0]
    elif mode == "lexical":
        res = filled.search_lexical(T, "c", text, 30, filter=few)
    else:
        res = filled.search_hybrid(T, "c", text, q, 30, filter=few)
    assert sorted(h.id for h in res.hits) == ["few0", "few1"]
    assert res.returned_k == 2 and res.exhaustive


def test_hybrid_fuses_both_rankings_and_reports_three_scores(engine):
    engine.create_collection(
        T, "h", dim=2, metric=Metric.IP, index_type=IndexType.FLAT, embedder=""
    )
    engine.upsert(
        T,
        "h",
        [
            Record("dense", np.float32([0.9, 0.1]), "nothing in common with the query", {}),
            Record("both", np.float32([1, 0]), "call SSL_CTX_set_options", {}),
            Record("words", np.float32([-1, 0]), "SSL_CTX_set_options SSL_CTX_set_options", {}),
        ],
    )
    q = np.float32([1, 0])
    rrf = Fusion(method=FusionMethod.RRF)
    res = engine.search_hybrid(T, "h", "SSL_CTX_set_options", q, 3, fusion=rrf)
    assert [h.id for h in res.hits][0] == "both"
    by = {h.id: h for h in res.hits}
    assert by["words"].dense == pytest.approx(-1.0)  # exact, though dense ranked it last
    assert by["dense"].lexical == 0.0 and by["dense"].dense == pytest.approx(0.9)
    assert by["words"].lexical > by["both"].lexical > 0
    assert all(h.score == h.fused for h in res.hits)
    assert by["both"].fused == pytest.approx(1 / 61 + 1 / 62)  # dense rank 1, lexical 2
    lexical_only = engine.search_hybrid(
        T, "h", "SSL_CTX_set_options", q, 3, fusion=Fusion(FusionMethod.WEIGHTED, 60, 0.0)
    )
    assert lexical_only.hits[0].id == "words" and lexical_only.hits[0].fused == 1.0
    with pytest.raises(InvalidArgument, match="dense_weight"):
        engine.search_hybrid(T, "h", "x", q, 3, fusion=Fusion(dense_weight=2.0))
    # no word that can match: the dense ranking alone
    assert [h.id for h in engine.search_hybrid(T, "h", "...", q, 3).hits] == [
        "both",
        "dense",
        "words",
    ]


def test_maintenance_keeps_the_lexical_index_in_step(filled, tmp_path):
    filled.delete(T, "c", ids=[f"p{i}" for i in range(0, 400, 3)])
    rng = np.random.default_rng(5)
    filled.upsert(
        T, "c", [Record(f"p{i}", _vec(rng), f"rewritten {i} kiwis", {}) for i in range(1, 60, 3)]
    )
    assert filled.compact(T, "c") > 0
    assert_lexical_matches_items(tmp_path / "data")
    filled.rebuild(T, "c", index_type=IndexType.HNSW)
    assert_lexical_matches_items(tmp_path / "data")
    assert {h.id for h in filled.search_lexical(T, "c", "kiwis", 100).hits} == {
        f"p{i}" for i in range(1, 60, 3)
    }
    filled.snapshot(tmp_path / "snap")
    filled.close()
    Engine.restore(tmp_path / "snap", tmp_path / "restored")
    with Engine(tmp_path / "restored") as eng:
        assert eng.search_lexical(T, "c", "E1102", 1).hits[0].id == "id1"
    assert_lexical_matches_items(tmp_path / "restored")


def test_a_collection_can_opt_out(engine, tmp_path):
    engine.create_collection(
        T,
        "plain",
        dim=2,
        metric=Metric.IP,
        index_type=IndexType.FLAT,
        embedder="",
        lexical_index=False,
    )
    engine.upsert(T, "plain", [Record("a", np.float32([1, 0]), "words nobody indexes", {})])
    assert not engine.describe(T, "plain").lexical_index
    with pytest.raises(FailedPrecondition, match="without a lexical index"):
        engine.search_lexical(T, "plain", "words", 1)
    with pytest.raises(FailedPrecondition):
        engine.search_hybrid(T, "plain", "words", np.float32([1, 0]), 1)
    assert engine.search(T, "plain", np.float32([1, 0]), 1)[0].hits[0].id == "a"
    assert_lexical_matches_items(tmp_path / "data")


def test_a_dropped_collection_takes_its_index(engine, tmp_path):
    engine.create_collection(
        T, "gone", dim=2, metric=Metric.IP, index_type=IndexType.FLAT, embedder=""
    )
    engine.upsert(T, "gone", [Record("a", np.float32([1, 0]), "ephemeral words", {})])
    engine.delete_collection(T, "gone")
    with pytest.raises(NotFound):
        engine.search_lexical(T, "gone", "ephemeral", 1)
    engine.create_collection(
        T, "gone", dim=2, metric=Metric.IP, index_type=IndexType.FLAT, embedder=""
    )
    assert not engine.search_lexical(T, "gone", "ephemeral", 1).hits
    assert_lexical_matches_items(tmp_path / "data")


def test_words_half_the_collection_holds_are_left_out_without_changing_the_ranking(
    engine, tmp_path
):
    import sqlite3

    from ragplane.index import lexical
    from ragplane.index.fts_query import match_expression

    engine.create_collection(
        T, "w", dim=2, metric=Metric.IP, index_type=IndexType.FLAT, embedder=""
    )
    rng = np.random.default_rng(2)
    texts = [f"the {w} of item {i}" for i, w in enumerate(["zebra", "okapi", "gnu"] * 40)]
    engine.upsert(
        T,
        "w",
        [
            Record(f"i{i}", rng.normal(size=2).astype(np.float32), t, {})
            for i, t in enumerate(texts)
        ],
    )
    db = sqlite3.connect(tmp_path / "data" / "ragplane.db")
    try:
        coll_id = db.execute("SELECT id FROM collections WHERE name = 'w'").fetchone()[0]
        terms = ["the", "zebra", "of", "okapi", "item"]
        assert lexical.weightless(db, coll_id, terms, len(texts)) == {"the", "of", "item"}
        full = lexical.ranked(db, coll_id, match_expression(" ".join(terms)), 200)
    finally:
        db.close()
    got = engine.search_lexical(T, "w", " ".join(terms), 200).hits
    # the same items with the same scores (but for the left-out words' 1e-6 weights), so
    # the same order but among near-ties; only items that hold nothing but those words
    # (the 40 "gnu" ones, each scored ~1e-5) are no longer listed
    want = {r[1]: r[2] for r in full if r[2] > 1e-3}
    assert len(want) == 80 and len(full) == 120
    assert {h.id: h.lexical for h in got} == pytest.approx(want, abs=1e-4)
    assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
    only_common = engine.search_lexical(T, "w", "the of", 5)
    assert only_common.returned_k == 5  # nothing else to go by: the words are kept
