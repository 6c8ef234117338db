"""The lexical postings in memory score every row exactly as FTS5's bm25() does, stay in step
with upserts, deletes and replacements, and hand over to FTS5 (same results) while they are
read in the background or when a collection is too large for them."""

from __future__ import annotations

import random
import re
import sqlite3
import time

import numpy as np
import pytest

from ragplane.index import Engine, IndexType, Metric, Record, lexical, postings
from ragplane.index.fts_query import match_expression, query_terms
from ragplane.index.types import Chunking, Condition, Filter, FilterOp, Span
from ragplane.testkit.texts import corpus

T = "tenant"
DIM = 8
IDENTIFIERS = ["SSL_CTX_set_options", "os.path.join", "zlib_rs", "Ωmega_42", "café_au_lait"]


def _spans(text: str, rng: np.random.Generator) -> list[Span]:
    """Chunks of about 12 words each (the engine keeps what the server's splitter gives)."""
    starts = [m.start() for m in re.finditer(r"\S+", text)][::12] or [0]
    ends = [*starts[1:], len(text)]
    return [Span(a, b, rng.normal(size=DIM).astype(np.float32))
            for a, b in zip(starts, ends, strict=True)]


def _records(texts, start=0, seed=0, chunked=False):
    rng = np.random.default_rng(seed)
    return [Record(f"p{start + i}", None if chunked else rng.normal(size=DIM).astype(np.float32),
                   t, {"group": (start + i) % 3}, chunks=_spans(t, rng) if chunked else ())
            for i, t in enumerate(texts)]


def _collection(engine: Engine, name: str = "c", chunked: bool = False) -> None:
    kw = {"chunking": Chunking(True, 256, 32)} if chunked else {}
    engine.create_collection(T, name, dim=DIM, metric=Metric.COSINE,
                             index_type=IndexType.FLAT, embedder="", **kw)


def _fts_scores(data_dir, name: str, text: str) -> dict[int, float]:
    """Every matching row's -bm25() for the expression a search ranks by."""
    db = sqlite3.connect(data_dir / "ragplane.db")
    try:
        coll_id = db.execute("SELECT id FROM collections WHERE name = ?", (name,)).fetchone()[0]
        n = db.execute(f"SELECT count(*) FROM {lexical.table(coll_id)}").fetchone()[0]
        common = lexical.weightless(db, coll_id, query_terms(text), n)
        match = match_expression(text, leave_out=common)
        return lexical.all_scores(db, coll_id, match) if match else {}
    finally:
        db.close()


def _memory_scores(engine: Engine, name: str, text: str) -> dict[int, float]:
    ctx = engine._ctx
    coll = ctx.get(T, name)
    p = postings.of(coll)
    assert p.ready(ctx, coll)
    terms = query_terms(text)
    phrases = postings.TOKENS.of(ctx.reader(), coll.id, terms)
    segments, view = p.view(coll)
    s = postings.score(segments, view, terms, phrases)
    return dict(zip(s.seqs.tolist(), s.values.tolist(), strict=True))


def _queries(texts, n, seed):
    rnd = random.Random(seed)
    out = list(IDENTIFIERS) + ["the of and", "sorting sorted sort"]
    for _ in range(n):
        words = rnd.choice(texts).split()
        a = rnd.randrange(max(1, len(words) - 6))
        out.append(" ".join(words[a:a + rnd.randint(1, 6)]))
    return out


@pytest.mark.parametrize("chunked", [False, True])
def test_every_row_scores_as_fts5_scores_it_to_the_last_bit(engine, tmp_path, chunked):
    texts = corpus(600) + [f"to fix it, call {i} then {i} again" for i in IDENTIFIERS]
    _collection(engine, chunked=chunked)
    engine.upsert(T, "c", _records(texts, chunked=chunked))
    _memory_scores(engine, "c", "function")  # read from the FTS5 table
    coll = engine._ctx.get(T, "c")
    assert coll.split == chunked  # rows are chunks: several per item
    # FTS5's own totals, which decide whether the postings are read inline or at all
    assert lexical.size(engine._ctx.reader(), coll.id) == (coll.live_count,
                                                          postings.of(coll).instances)
    # later writes land in segments of their own; deletes and replacements leave rows dead
    engine.upsert(T, "c", _records(corpus(700)[600:], start=len(texts), seed=1,
                                   chunked=chunked))
    engine.delete(T, "c", ids=[f"p{i}" for i in range(0, 700, 7)])
    _memory_scores(engine, "c", "function")  # tokenised from the items
    engine.upsert(T, "c", _records(["sorting os.path.join the café"] * 3, start=3, seed=2,
                                   chunked=chunked))
    compared = 0
    for q in _queries(texts, 60, seed=4):
        want = _fts_scores(tmp_path / "data", "c", q)
        got = _memory_scores(engine, "c", q)
        assert got == want, q  # the same rows, every score equal as floats
        compared += len(want)
    assert compared > 5000
    assert len(postings.of(engine._ctx.get(T, "c")).state[0]) == 3


def test_segments_merge_and_leave_deleted_rows_out(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(postings, "MAX_SEGMENTS", 3)
    _collection(engine)
    texts = corpus(300)
    for i in range(0, 300, 30):
        engine.upsert(T, "c", _records(texts[i:i + 30], start=i, seed=i))
        engine.delete(T, "c", ids=[f"p{i}"])
        engine.search_lexical(T, "c", "function", 3)  # reads the new rows: one segment each
    segments = postings.of(engine._ctx.get(T, "c")).state[0]
    assert len(segments) <= 3
    held = np.concatenate([s.seqs for s in segments])
    assert held.size < 300 - 10 + 1  # the merged segments dropped deleted rows
    for q in ["function argument", "os.path module", "the class"]:
        assert _memory_scores(engine, "c", q) == _fts_scores(tmp_path / "data", "c", q)


@pytest.mark.parametrize("chunked", [False, True])
def test_results_are_the_same_through_fts5_in_memory_and_after_a_background_read(
        tmp_path, monkeypatch, chunked):
    texts = corpus(400)
    queries = _queries(texts, 12, seed=9)
    flt = Filter(must=(Condition("group", FilterOp.EQ, 1),))

    def results(eng):
        out = []
        for q in queries:
            for f in (None, flt):
                lex = eng.search_lexical(T, "c", q, 10, filter=f, chunks_per_hit=2)
                hyb = eng.search_hybrid(T, "c", q, np.ones(DIM, np.float32), 10, filter=f)
                out.append([(h.id, round(h.score, 9), [(c.start, c.end) for c in h.chunks])
                            for h in lex.hits])
                out.append([(h.id, round(h.lexical, 9), round(h.dense, 6)) for h in hyb.hits])
        return out

    eng = Engine(tmp_path / "data")
    try:
        _collection(eng, chunked=chunked)
        eng.upsert(T, "c", _records(texts, chunked=chunked))
        monkeypatch.setattr(postings, "MAX_INSTANCES", 10)  # too big: FTS5 ranks
        through_fts5 = results(eng)
        assert postings.of(eng._ctx.get(T, "c")).too_big
    finally:
        eng.close()
    monkeypatch.setattr(postings, "MAX_INSTANCES", 10**9)
    monkeypatch.setattr(postings, "INLINE_INSTANCES", 50)  # read in the background
    eng = Engine(tmp_path / "data")
    try:
        first = results(eng)  # FTS5 ranks while the postings are read
        p = postings.of(eng._ctx.get(T, "c"))
        deadline = time.monotonic() + 30
        while p.reading and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.upto == eng._ctx.get(T, "c").indexed_seq and p.instances > 10_000
        assert results(eng) == first == through_fts5
    finally:
        eng.close()


def test_the_best_rows_come_first_ties_by_item_id():
    rnd = random.Random(3)
    for _ in range(300):
        n = rnd.randint(1, 60)
        seqs = np.array(sorted(rnd.sample(range(1, 10**6), n)), np.int64)
        values = np.array([float(rnd.randint(0, 4)) for _ in range(n)])
        ids = {int(s): f"i{rnd.randint(0, 10**6):07d}" for s in seqs}
        gone = set(rnd.sample(sorted(ids), n // 5))
        scores = postings.Scores(seqs, values)

        def id_of(s, gone=gone, ids=ids):
            return None if s in gone else ids[s]

        rows = sorted(((s, ids[s], v) for s, v in zip(seqs.tolist(), values.tolist(),
                                                         strict=True) if s not in gone),
                      key=lambda r: (-r[2], r[1]))
        for limit in (1, 2, n // 2 + 1, n, n + 3):
            top = scores.top(id_of, limit)
            # every row above the cut, and at the cut those first by item id; a row deleted
            # since scoring may leave the list short, never out of order
            assert top == [r for r in rows if r in top]
            assert [r[2] for r in top] == [r[2] for r in rows[: len(top)]]
        missing = int(seqs[-1]) + 1
        assert scores.of([missing, int(seqs[0])]) == {int(seqs[0]): float(values[0])}


def test_instances_are_put_in_row_then_position_order_when_they_come_otherwise():
    n = np.array([2, 2])
    assert postings._ordered(n, np.array([3, 5, 1, 1]), np.array([0, 0, 2, 7]))
    assert not postings._ordered(n, np.array([5, 3, 1, 1]), np.array([0, 0, 2, 7]))
    assert not postings._ordered(n, np.array([3, 5, 1, 1]), np.array([0, 0, 7, 2]))


def test_a_word_of_one_repeated_token_is_left_out_as_fts5s_path_leaves_it(engine, tmp_path):
    # "foo_foo" is the phrase "foo foo"; lexical.weightless leaves it out by the rows holding
    # "foo" (half of them here), so the postings must too, or the two paths score differently
    _collection(engine)
    texts = [f"foo item {i}" for i in range(30)] + [f"foo_foo zebra {i}" for i in range(3)]
    engine.upsert(T, "c", _records(texts + [f"other {i}" for i in range(10)]))
    want = _fts_scores(tmp_path / "data", "c", "foo_foo zebra")
    assert len(want) == 3  # only the zebra rows: "foo_foo" was left out
    assert _memory_scores(engine, "c", "foo_foo zebra") == want
