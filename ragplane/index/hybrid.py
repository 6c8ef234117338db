"""Lexical search (BM25 over the collection's FTS5 index) and hybrid search (the dense and
lexical rankings fused by `ragplane.index.fusion`).

Both apply the metadata filter in SQL, inside the ranking, so a filter never leaves a
ranking short while items that match it exist. Lexical results are exact: FTS5 scores every
item that holds a query word, leaving out only words that half the collection holds, whose
BM25 weight FTS5 floors at 1e-6 (`lexical.weightless`). A hybrid result is exhaustive when
its dense ranking was.

A hybrid search ranks `candidates(top_k)` items by each method, fuses the two lists and
reports, for every hit, its dense score (computed exactly from the stored vector when only
the lexical ranking found it), its lexical score (0 when no query word occurs in it) and
the fused score.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragplane.core.errors import FailedPrecondition, NotFound
from ragplane.index import lexical
from ragplane.index import repository as repo
from ragplane.index import search as dense_search
from ragplane.index.context import Context
from ragplane.index.filters import compile_filter
from ragplane.index.fts_query import match_expression, query_terms
from ragplane.index.fusion import check, fuse
from ragplane.index.state import Coll
from ragplane.index.types import Filter, Fusion, Hit, Metric, SearchResult
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


def _ranked(ctx: Context, coll: Coll, text: str, limit: int, filter: Filter | None):
    """The lexical ranking of `text`: (seq, item id, score), best first."""
    where, args = _where(filter)
    terms = query_terms(text)
    if not terms:  # no word that could match: nothing ranks
        return []
    conn = ctx.reader()
    try:
        common = lexical.weightless(conn, coll.id, terms, coll.live_count)
        match = match_expression(text, leave_out=common)
        assert match is not None
        return lexical.ranked(conn, coll.id, match, limit, where, args)
    except sqlite3.OperationalError:
        if ctx.find(coll.tenant, coll.name) is not coll:  # its table went with it
            raise NotFound(f"collection {coll.name!r} was deleted") from None
        raise


def search_lexical(
    ctx: Context,
    tenant: str,
    name: str,
    text: str,
    top_k: int,
    filter: Filter | None,
    include_text: bool,
    include_metadata: bool,
) -> SearchResult:
    """The `top_k` live items best matching the words of `text` by BM25, best first."""
    coll = _lexical_coll(ctx, tenant, name)
    k = check_top_k(top_k)
    rows = _ranked(ctx, coll, text, k, filter)
    extra = _extras(ctx, [r[0] for r in rows], include_text, include_metadata)
    hits = [
        Hit(
            id=item_id,
            score=s,
            text=extra.get(seq, ("", {}))[0],
            metadata=extra.get(seq, ("", {}))[1],
            lexical=s,
        )
        for seq, item_id, s in rows
    ]
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
) -> SearchResult:
    """The `top_k` live items best by the fusion of the dense ranking of `vector` (the
    embedding of `text`) and the lexical ranking of `text`."""
    coll = _lexical_coll(ctx, tenant, name)
    k = check_top_k(top_k)
    check(fusion)
    q = query_vectors(vector, coll.dim, coll.metric, coll.name)[0]
    n = candidates(k)
    match = match_expression(text)
    dense = dense_search.search(ctx, tenant, name, q, n, filter, False, False)[0]
    lex = _ranked(ctx, coll, text, n, filter)
    fused = fuse([(h.id, h.score) for h in dense.hits], [(i, s) for _, i, s in lex], fusion, k)
    if not fused:
        return SearchResult(hits=(), returned_k=0, exhaustive=dense.exhaustive)
    conn = ctx.reader()
    rows = {r[0]: r for r in repo.items_by_id(conn, coll.id, [f.id for f in fused], True)}
    unscored = [f.id for f in fused if f.lexical is None]
    lexical_of = lexical.scores_of_ids(conn, coll.id, match, unscored) if match and unscored else {}
    hits = []
    for f in fused:
        row = rows.get(f.id)
        if row is None:  # deleted since it was ranked
            continue
        d = f.dense if f.dense is not None else _score(coll.metric, row[3], q)
        lx = f.lexical if f.lexical is not None else lexical_of.get(f.id, 0.0)
        hits.append(
            Hit(
                id=f.id,
                score=f.score,
                text=row[1] if include_text else "",
                metadata=json.loads(row[2]) if include_metadata else {},
                dense=d,
                lexical=lx,
                fused=f.score,
            )
        )
    return SearchResult(hits=hits, returned_k=len(hits), exhaustive=dense.exhaustive)


def _score(metric: Metric, blob: bytes, q: np.ndarray) -> float:
    """The dense score of a stored vector, as FAISS reports it (higher is better)."""
    v = np.frombuffer(blob, dtype=np.float32)
    if metric == Metric.L2:
        return -float(np.sum((v - q) ** 2))
    return float(v @ q)
