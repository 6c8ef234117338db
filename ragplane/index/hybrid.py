"""Lexical search (BM25 over the collection's lexical index) and hybrid search (the dense and
lexical rankings fused by `ragplane.index.fusion`).

Lexical results are exact: every row that holds a query word is scored, leaving out only
words that half the collection holds, whose BM25 weight FTS5 floors at 1e-6
(`lexical.weightless`). The scores come from the collection's postings in memory
(`ragplane.index.postings`, FTS5's bm25() to the last bit); while those are read, or for a
collection too large for them, from FTS5 itself. A metadata filter applies inside the
ranking, so it never leaves a ranking short while items that match it exist. A hybrid
result is exhaustive when its dense ranking was.

A hybrid search ranks `candidates(top_k)` items by each method, fuses the two lists and
reports, for every hit, its dense score (computed exactly from the stored vector when only
the lexical ranking found it), its lexical score (0 when no query word occurs in it) and
the fused score.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ragplane.core.errors import FailedPrecondition, NotFound
from ragplane.index import chunks, lexical, postings
from ragplane.index import repository as repo
from ragplane.index import search as dense_search
from ragplane.index.context import Context
from ragplane.index.filters import compile_filter
from ragplane.index.fts_query import match_expression, query_terms
from ragplane.index.fusion import FusedRows, check, fuse_rows
from ragplane.index.postings import Scores
from ragplane.index.reads import matching
from ragplane.index.state import Coll
from ragplane.index.types import Filter, Fusion, Hit, SearchResult
from ragplane.index.validate import MAX_TOP_K, check_top_k, query_vectors

# Each ranking contributes this many candidates (at least) to the fusion: deep enough that
# an item ranked well by one method and fairly by the other is seen by both.
MIN_CANDIDATES = 100
CANDIDATES_PER_HIT = 4


def candidates(top_k: int) -> int:
    return min(MAX_TOP_K, max(MIN_CANDIDATES, CANDIDATES_PER_HIT * top_k))


def _lexical_coll(ctx: Context, tenant: str, name: str) -> Coll:
    coll = ctx.get(tenant, name)
    if not coll.lexical:
        raise FailedPrecondition(
            f"collection {name!r} was created without a lexical index (lexical_index=false), "
            "so it has no lexical or hybrid search; search it in dense mode, or create a "
            "collection with the index and upsert the items into it"
        )
    return coll


def _where(filter: Filter | None) -> tuple[str, list[Any]]:
    where, args = compile_filter(filter)  # validates an empty filter too
    return ("", []) if filter is None or filter.is_empty() else (where, args)


@contextmanager
def _table_of(ctx: Context, coll: Coll) -> Iterator[None]:
    """SQLite's error for the collection's lexical table, gone because the collection was
    deleted while the search ran, as NotFound; any other as it is."""
    try:
        yield
    except sqlite3.OperationalError:
        if ctx.find(coll.tenant, coll.name) is not coll:  # its table went with it
            raise NotFound(f"collection {coll.name!r} was deleted") from None
        raise


def _ranked(ctx: Context, coll: Coll, text: str, limit: int, filter: Filter | None,
            match: str | None = None) -> list[chunks.Row]:
    """The lexical ranking of `text`: (seq, item id, score), best first (`match`: its
    `_match`, when the caller has it)."""
    where, args = _where(filter)
    match = match or _match(ctx, coll, text)
    if match is None:  # no word that could match: nothing ranks
        return []
    with _table_of(ctx, coll):
        return lexical.ranked(ctx.reader(), coll.id, match, limit, where, args)


def _match(ctx: Context, coll: Coll, text: str) -> str | None:
    """The FTS5 expression a search ranks by: the query's words, less those that half the
    rows or more hold (`lexical.weightless`); None when no word can match."""
    terms = query_terms(text)
    if not terms:
        return None
    with _table_of(ctx, coll):
        common = lexical.weightless(ctx.reader(), coll.id, terms, coll.live_count)
    return match_expression(text, leave_out=common)


def _scores(ctx: Context, coll: Coll, text: str, filter: Filter | None) -> Scores | None:
    """Every matching row's BM25 score (only rows the filter matches, with one), from the
    collection's postings in memory (`ragplane.index.postings`), or from one FTS5 scoring
    while those are not ready and there is no filter; None when FTS5 must rank with the
    filter (`_ranked`)."""
    filtered = bool(_where(filter)[0])
    held = postings.of(coll)
    with _table_of(ctx, coll):
        ready = held.ready(ctx, coll)
        terms = query_terms(text)
        if ready and terms:
            phrases = postings.TOKENS.of(ctx.reader(), coll.id, terms)
            ready = all(phrases)  # a word the tokenizer drops entirely: FTS5 decides
        if ready:
            scores = postings.EMPTY
            if terms:
                segments, view = held.view(coll)
                scores = postings.score(segments, view, terms, phrases)
            if coll.dropped:
                raise NotFound(f"collection {coll.name!r} was deleted")
            if filter is not None and filtered:
                return scores.restrict(matching(ctx, coll, filter))
            return scores
    if filtered:
        return None
    match = _match(ctx, coll, text)
    return _all_scores(ctx, coll, match) if match else postings.EMPTY


def search_lexical(
    ctx: Context,
    tenant: str,
    name: str,
    text: str,
    top_k: int,
    filter: Filter | None,
    include_text: bool,
    include_metadata: bool,
    chunks_per_hit: int = 1,
) -> SearchResult:
    """The `top_k` live items best matching the words of `text` by BM25, best first; an item
    split into chunks ranks by its best chunk (BM25 scores chunks: the lexical index holds
    them)."""
    coll = _lexical_coll(ctx, tenant, name)
    k = check_top_k(top_k)
    per_hit = chunks.check_chunks_per_hit(chunks_per_hit)
    scores = _scores(ctx, coll, text, filter)
    id_of = coll.seq_to_id.get
    if not (coll.chunking.enabled or coll.split):
        rows = scores.top(id_of, k) if scores is not None else _ranked(ctx, coll, text, k,
                                                                       filter)
        extra = _extras(ctx, [r[0] for r in rows], include_text, include_metadata)
        hits = [
            Hit(id=item_id, score=s, text=extra.get(seq, ("", {}))[0],
                metadata=extra.get(seq, ("", {}))[1], lexical=s)
            for seq, item_id, s in rows
        ]
        return SearchResult(hits=hits, returned_k=len(hits), exhaustive=True)
    groups: list[chunks.Group] = []
    match = None if scores is not None else _match(ctx, coll, text)
    for depth in chunks.depths(k, per_hit, coll.live_count):
        if scores is not None:  # every depth from one scoring
            rows = scores.top(id_of, depth)
        else:
            rows = _ranked(ctx, coll, text, depth, filter, match)
        groups = chunks.group(rows, k, per_hit)
        if len(groups) >= k or len(rows) < depth:
            break
    passages, extra = chunks.passages(
        ctx.reader(), [g for _, g in groups], include_text, include_metadata, include_text
    )
    hits = []
    for (item_id, g), ch in zip(groups, passages, strict=True):
        text_, md = extra.get(g[0][0], ("", {}))
        hits.append(Hit(id=item_id, score=g[0][1], text=text_, metadata=md, lexical=g[0][1],
                        chunks=ch))
    return SearchResult(hits=hits, returned_k=len(hits), exhaustive=True)


def _extras(
    ctx: Context, seqs: Sequence[int], include_text: bool, include_metadata: bool
) -> dict[int, tuple[str, Any]]:
    if not (include_text or include_metadata) or not seqs:
        return {}
    return {
        seq: (text if include_text else "", json.loads(md) if include_metadata else {})
        for seq, text, md in repo.texts_of(ctx.reader(), seqs)
    }


def _fused_rows(
    ctx: Context, coll: Coll, text: str, q: np.ndarray, k: int, per_hit: int, fusion: Fusion,
    filter: Filter | None,
    scores: Scores | None,
) -> tuple[list[chunks.Group], FusedRows, bool]:
    """Both rankings of rows (chunks), fused per row, then grouped per item: the first `k`
    items with their best `per_hit` rows, every row's Fused, and whether the dense ranking
    was exact. Rows are read deeper until `k` items come out or the rankings run dry.
    `scores`: every matching row's lexical score (`_scores`), or None for FTS5 to rank
    with the filter."""
    grouped = coll.chunking.enabled or coll.split
    depths = chunks.depths(candidates(k), per_hit, coll.live_count) if grouped else [candidates(k)]
    groups: list[chunks.Group] = []
    fused = fuse_rows([], [], fusion)
    exhaustive = True
    match = None if scores is not None else _match(ctx, coll, text)
    for n in depths:
        dense, exhaustive = dense_search.ranked_rows(ctx, coll, q, n, filter)
        if scores is not None:  # every depth from one scoring
            lex = scores.top(coll.seq_to_id.get, n)
        else:
            lex = _ranked(ctx, coll, text, n, filter, match) if match else []
        # keyed (item id, seq): rows are fused one by one, ties broken by item id
        fused = fuse_rows(dense, lex, fusion)
        groups = chunks.group(fused.rows(), k, per_hit)
        if len(groups) >= k or (len(dense) < n and len(lex) < n):
            break
    return groups, fused, exhaustive


def _all_scores(ctx: Context, coll: Coll, match: str) -> Scores:
    with _table_of(ctx, coll):
        return Scores.of_dict(lexical.all_scores(ctx.reader(), coll.id, match))


def search_hybrid(
    ctx: Context,
    tenant: str,
    name: str,
    text: str,
    vector: np.ndarray,
    top_k: int,
    fusion: Fusion,
    filter: Filter | None,
    include_text: bool,
    include_metadata: bool,
    chunks_per_hit: int = 1,
) -> SearchResult:
    """The `top_k` live items best by the fusion of the dense ranking of `vector` (the
    embedding of `text`) and the lexical ranking of `text`: fused per chunk, then each item
    by its best chunk, whose dense, lexical and fused scores the hit reports."""
    coll = _lexical_coll(ctx, tenant, name)
    k = check_top_k(top_k)
    per_hit = chunks.check_chunks_per_hit(chunks_per_hit)
    check(fusion)
    q = query_vectors(vector, coll.dim, coll.metric, coll.name)[0]
    scores = _scores(ctx, coll, text, filter)
    groups, fused, exhaustive = _fused_rows(ctx, coll, text, q, k, per_hit, fusion, filter,
                                             scores)
    if not groups:
        return SearchResult(hits=(), returned_k=0, exhaustive=exhaustive)
    conn = ctx.reader()
    best = [g[0][0] for _, g in groups]
    best_fused = {s: fused.get(s) for s in best}
    dense_of = _dense_scores(conn, coll, q, [s for s in best if best_fused[s].dense is None])
    # the ranking's own expression: the same scores, and no seek through the postings of
    # words most rows hold (a seek reads every phrase's postings to the row)
    unscored = [s for s in best if best_fused[s].lexical is None]
    if scores is not None:
        lexical_of = scores.of(unscored)
    else:
        match = _match(ctx, coll, text) if unscored else None
        lexical_of = lexical.scores_of_seqs(conn, coll.id, match, unscored) if match else {}
    passages, extra = chunks.passages(conn, [g for _, g in groups], include_text,
                                      include_metadata, include_text)
    hits = []
    for (item_id, g), ch in zip(groups, passages, strict=True):
        seq, f = g[0][0], best_fused[g[0][0]]
        if seq not in extra:  # deleted since it was ranked
            continue
        text_, md = extra[seq]
        d = f.dense if f.dense is not None else dense_of.get(seq, 0.0)
        lx = f.lexical if f.lexical is not None else lexical_of.get(seq, 0.0)
        hits.append(Hit(id=item_id, score=f.score, text=text_, metadata=md, dense=d,
                        lexical=lx, fused=f.score, chunks=ch))
    return SearchResult(hits=hits, returned_k=len(hits), exhaustive=exhaustive)


def _dense_scores(conn: sqlite3.Connection, coll: Coll, q: np.ndarray, seqs: list[int]
                  ) -> dict[int, float]:
    """Dense scores of rows only the lexical ranking found, from their stored vectors."""
    if not seqs:
        return {}
    found, vecs = repo.vectors_of(conn, np.asarray(seqs, dtype=np.int64), coll.dim)
    return dict(zip(found.tolist(), chunks.scores(coll.metric, vecs, q).tolist(), strict=True))
