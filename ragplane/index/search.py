"""Search planning: FAISS, a BLAS batch over a flat index, or an exact scan of few matches.

Scores are higher-is-better for every metric (l2: negative squared distance).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import faiss
import numpy as np

from ragplane.core import cpus
from ragplane.core.errors import NotFound
from ragplane.index import chunks
from ragplane.index import faiss_index as fx
from ragplane.index import repository as repo
from ragplane.index.context import Context
from ragplane.index.filters import compile_filter
from ragplane.index.gpu import GPU_MAX_K
from ragplane.index.reads import matching
from ragplane.index.rescore import rescore
from ragplane.index.state import Coll
from ragplane.index.types import Filter, Hit, IndexType, Metric, SearchKnobs, SearchResult
from ragplane.index.validate import check_knobs, check_top_k, query_vectors

# A filtered search scans the matching vectors exactly when the filter leaves at most this
# many (or this fraction of) live items: cheap, and exact, whatever the index.
EXACT_SCAN_MAX = 4096
EXACT_SCAN_FRACTION = 0.02
# A collection keeps the decoded int8 codes of its recent small filters' matches, up to
# this many bytes (a filter of 1% of 1M x 384 takes 15 MB): a repeated filter (a tenant, a
# source) is then scored without decoding again.
DECODED_CACHE_BYTES = 64 << 20

RawHits = list[list[tuple[int, str, float]]]  # per query: (seq, item id, score)


if "__dict__" in dir(Hit) and not hasattr(Hit, "__slots__"):
    _new = object.__new__

    def _hit(item_id: str, score: float, text: str, metadata: Any, passages: Any = ()) -> Hit:
        # Hit is a frozen dataclass, whose __init__ (object.__setattr__ per field) costs
        # ~3x this; searches build up to top_k of them per query.
        h = _new(Hit)
        h.__dict__.update(
            id=item_id, score=score, text=text, metadata=metadata, dense=score, lexical=None,
            fused=None, chunks=passages,
        )
        return h

else:  # pragma: no cover - if Hit ever gains __slots__

    def _hit(item_id: str, score: float, text: str, metadata: Any, passages: Any = ()) -> Hit:
        return Hit(id=item_id, score=score, text=text, metadata=metadata, dense=score,
                   chunks=passages)


def _mask_lookup(mask: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def allowed(ids: np.ndarray) -> np.ndarray:
        ok = ids < mask.size
        ok[ok] = mask[ids[ok]]
        return ok

    return allowed


def search(
    ctx: Context, tenant: str, name: str, queries: Any, top_k: int, filter: Filter | None,
    include_text: bool, include_metadata: bool, chunks_per_hit: int = 1, *,
    knobs: SearchKnobs | None = None,
) -> list[SearchResult]:
    """Nearest live items to each row of `queries` ([n, dim] or [dim]), best first; an
    item ranks by its best chunk and carries its best `chunks_per_hit` chunks. `knobs`:
    this request's search parameters (None: the collection's defaults).

    One FAISS call serves all rows. With a filter, results fill `top_k` whenever that many
    live items match; `exhaustive` says whether the result is exact.
    """
    coll = ctx.get(tenant, name)
    k = check_top_k(top_k)
    per_hit = chunks.check_chunks_per_hit(chunks_per_hit)
    q = query_vectors(queries, coll.dim, coll.metric, coll.name)
    knobs = collection_knobs(coll, knobs)
    found = _matches(ctx, coll, filter)
    grouped = coll.chunking.enabled or coll.split
    with coll.rw.read():
        if coll.dropped:
            raise NotFound(f"collection {name!r} was deleted")
        planned = _run_items(ctx, coll, q, k, found, per_hit, knobs) if grouped else _run(
            ctx, coll, q, k, found, knobs)
    if planned is not None and grouped:
        groups, exhaustive, exact_rows = planned
        return _item_results(ctx, coll, q, groups, exhaustive, exact_rows, include_text,
                             include_metadata, per_hit)
    if planned is None:
        return [SearchResult(hits=(), returned_k=0, exhaustive=True) for _ in range(len(q))]
    raw, exhaustive, exact_rows = planned
    extra = _extras(ctx, raw, include_text, include_metadata)
    out = []
    for row, hits in enumerate(raw):
        if extra:
            hl = [_hit(i, s, extra[seq][0], extra[seq][1]) for seq, i, s in hits]
        else:
            hl = [_hit(i, s, "", {}) for _, i, s in hits]
        row_exact = exhaustive or row in exact_rows
        out.append(SearchResult(hits=hl, returned_k=len(hl), exhaustive=bool(row_exact)))
    return out


def collection_knobs(coll: Coll, knobs: SearchKnobs | None) -> SearchKnobs:
    """`knobs` checked against the collection (InvalidArgument when one does not apply)."""
    nlist = coll.rparams.ivf_nlist if coll.built_type == IndexType.IVF_PQ else None
    return check_knobs(knobs, coll.name, coll.index_type, coll.params, nlist)


def _matches(ctx: Context, coll: Coll, filter: Filter | None) -> np.ndarray | None:
    """The rows a non-empty filter matches (None: no filter, every live row); an empty
    filter is only validated."""
    if filter is not None and not filter.is_empty():
        return matching(ctx, coll, filter)
    if filter is not None:
        compile_filter(filter)
    return None


def ranked_rows(
    ctx: Context, coll: Coll, q: np.ndarray, depth: int, filter: Filter | None, *,
    knobs: SearchKnobs | None = None,
) -> tuple[list[tuple[int, str, float]], bool]:
    """The best `depth` live rows (chunks) for the one query `q` ([dim], prepared), as
    (seq, item id, score), and whether the ranking is exact: hybrid search's dense side."""
    knobs = collection_knobs(coll, knobs)
    found = _matches(ctx, coll, filter)
    with coll.rw.read():
        if coll.dropped:
            raise NotFound(f"collection {coll.name!r} was deleted")
        planned = _run(ctx, coll, q[None, :], depth, found, knobs)
    if planned is None:
        return [], True
    raw, exhaustive, exact_rows = planned
    return raw[0], bool(exhaustive or 0 in exact_rows)


def _run_items(
    ctx: Context, coll: Coll, q: np.ndarray, k: int, found: np.ndarray | None, per_hit: int,
    knobs: SearchKnobs,
) -> tuple[list[Any], bool, set[int]] | None:
    """`_run` for items of several chunks: rows read deep enough to hold `k` items per query
    (or every candidate row), then grouped by item. Called under `rw` (read)."""
    n_rows = coll.live_count if found is None else int(np.count_nonzero(coll.live.contains(found)))
    planned = None
    # while no item is split, rows are items: no need to read deeper
    for depth in chunks.depths(k, per_hit, n_rows) if coll.split else [k]:
        planned = _run(ctx, coll, q, depth, found, knobs)
        if planned is None:
            return None
        groups = [chunks.group(raw, k, per_hit) for raw in planned[0]]
        if depth >= n_rows or all(len(g) >= k for g in groups):
            return groups, planned[1], planned[2]
    return None


def _scorer(metric: Metric, qi: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Exact scores of vectors [n, dim] for the one query `qi`."""
    return lambda X: chunks.scores(metric, X, qi)


def _item_results(
    ctx: Context, coll: Coll, q: np.ndarray, groups: list[Any], exhaustive: bool,
    exact_rows: set[int], include_text: bool, include_metadata: bool, per_hit: int,
) -> list[SearchResult]:
    """Hits of grouped rankings, with their passages: one SQL read for every query's hits.
    Asked for several passages per hit, each hit's are its best chunks scored exactly."""
    conn = ctx.reader()
    if per_hit > 1 and coll.split:
        groups = [
            chunks.best_chunks(conn, coll.id, items, per_hit, _scorer(coll.metric, qi), coll.dim)
            for items, qi in zip(groups, q, strict=True)
        ]
    flat = [g for items in groups for _, g in items]
    passages, extra = chunks.passages(conn, flat, include_text, include_metadata, include_text)
    out, at = [], 0
    for row, items in enumerate(groups):
        hits = []
        for item_id, g in items:
            text, md = extra.get(g[0][0], ("", {}))
            hits.append(_hit(item_id, g[0][1], text, md, passages[at]))
            at += 1
        out.append(SearchResult(hits=hits, returned_k=len(hits),
                                exhaustive=bool(exhaustive or row in exact_rows)))
    return out


def _run(
    ctx: Context, coll: Coll, q: np.ndarray, k: int, found: np.ndarray | None,
    knobs: SearchKnobs,
) -> tuple[RawHits, bool, set[int]] | None:
    """Search under `rw` (read); None when nothing can match. Returns the raw hits, whether
    every row is exact, and the rows redone exactly. An index of lossy codes hands
    k x oversampling candidates to the exact rescoring. FAISS's work needs no GIL: a
    request thread does it on any core (`ragplane.core.cpus`)."""
    with cpus.wide():
        return _run_wide(ctx, coll, q, k, found, knobs)


def _run_wide(
    ctx: Context, coll: Coll, q: np.ndarray, k: int, found: np.ndarray | None,
    knobs: SearchKnobs,
) -> tuple[RawHits, bool, set[int]] | None:
    if found is not None:
        # deleted since, or committed but not yet indexed: left out
        found = found[coll.live.contains(found)]
        n_candidates = int(found.size)
    else:
        n_candidates = coll.live_count
    if n_candidates == 0:
        return None
    lossy = fx.lossy(coll.built_type, coll.rparams)
    exhaustive = coll.built_type == IndexType.FLAT and not lossy
    exact_rows: set[int] = set()
    few = n_candidates <= EXACT_SCAN_MAX or n_candidates <= EXACT_SCAN_FRACTION * coll.live_count
    if knobs.exact and not exhaustive:
        cand = found if found is not None else coll.live.to_array()
        dist, lab = exact(ctx, coll, q, k, cand)
        exhaustive = True
    elif found is not None and few and not lossy:
        # flat too: a batch's BLAS scan scores every live row; this, only the matching ones
        dist, lab = exact(ctx, coll, q, k, found)
        exhaustive = True
    else:
        if lossy:
            over = knobs.oversampling or fx.default_oversampling(coll.built_type)
            depth = fx.rescore_depth(k, over)
            if found is not None and few:  # the matching codes, all of them, from memory
                cand = _scan_codes(ctx, coll, q, depth, found, knobs)
            else:
                _, cand = _indexed(ctx, coll, q, depth, found, knobs)
            dist, lab = rescore(q, cand, lambda s: repo.vectors_of(ctx.reader(), s, coll.dim),
                                k, coll.metric)
        else:
            dist, lab = _indexed(ctx, coll, q, k, found, knobs)
        if not exhaustive:
            exact_rows = _fill_short(ctx, coll, q, k, found, n_candidates, dist, lab)
    return _raw_hits(coll, dist, lab), exhaustive, exact_rows


def _indexed(
    ctx: Context, coll: Coll, q: np.ndarray, k: int, found: np.ndarray | None,
    knobs: SearchKnobs,
) -> tuple[np.ndarray, np.ndarray]:
    """Search the collection's index, restricted to `found` (or the live set)."""
    mask = None
    if found is not None:
        mask = _found_mask(coll, found)
        sel: Any = fx.BitmapSelector(mask)
    elif coll.index.ntotal > coll.live_count:
        sel = coll.live_selector()
    else:
        sel = None
    flat = coll.built_type == IndexType.FLAT and not fx.lossy(coll.built_type, coll.rparams)
    if ctx.gpu is not None and flat and sel is None and k <= GPU_MAX_K:
        return ctx.gpu.search(coll.id, coll.index, q, k)
    if flat and q.shape[0] >= fx.BLAS_MIN_QUERIES:
        if mask is not None:
            allowed = _mask_lookup(mask)
        elif sel is not None:
            allowed = coll.live.contains
        else:
            allowed = None
        return fx.flat_batch_search(coll.index, q, k, coll.metric, allowed)
    params = fx.search_params(coll.built_type, coll.rparams, k,
                              sel.sel if sel is not None else None, knobs.ef_search,
                              knobs.nprobe)
    fx.threads_for(q.shape[0])
    hits: tuple[np.ndarray, np.ndarray] = coll.index.search(q, k, params=params)
    return hits


def _scan_codes(
    ctx: Context, coll: Coll, q: np.ndarray, depth: int, found: np.ndarray, knobs: SearchKnobs
) -> np.ndarray:
    """The best `depth` of the matching rows `found` (live) by their lossy codes, every one
    of them scored in memory: the candidates a small filter hands to the rescoring, where
    an exact scan would read every matching float vector from the store. int8 codes (flat
    or HNSW, whose graph a filter this selective would cut into pieces) are decoded in bulk,
    once for the batch and kept for the filter's next search; IVF-PQ's lists are all probed
    under the filter."""
    if coll.built_type == IndexType.IVF_PQ:
        every_list = replace(knobs, nprobe=coll.rparams.ivf_nlist)
        return _indexed(ctx, coll, q, depth, found, every_list)[1]
    seqs, X, sqnorms = _decoded(coll, found)
    if not seqs.size:
        return np.full((q.shape[0], depth), -1, dtype=np.int64)
    scores = q @ X.T  # [nq, matches]; l2 ranks by 2 q.x - |x|^2 (|q|^2 is the row's own)
    if coll.metric == Metric.L2:
        scores = 2 * scores - sqnorms
    kk = min(depth, seqs.size)
    best = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]  # unordered: all are rescored
    return seqs[best]


def _decoded(coll: Coll, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seqs of `found` in the index, their int8 codes decoded, and their squared norms:
    from the collection's cache when the same rows were scanned in this generation."""
    key = (coll.generation, hashlib.blake2b(found.tobytes(), digest_size=16).digest())
    with coll.cache_lock:
        hit = coll.decoded_cache.get(key)
        if hit is not None:
            coll.decoded_cache.move_to_end(key)
            return hit
    n = coll.index.ntotal
    seq_at = faiss.rev_swig_ptr(coll.index.id_map.data(), n) if n else np.zeros(0, np.int64)
    # (the index may hold a deleted row above the live set's range: sized to cover it)
    mask = np.zeros(max(coll.live.capacity, int(seq_at.max(initial=0)) + 1), dtype=bool)
    mask[found] = True
    pos = np.flatnonzero(mask[seq_at])
    inner = faiss.downcast_index(coll.index.index)
    sq = faiss.downcast_index(inner.storage) if coll.built_type == IndexType.HNSW else inner
    codes = faiss.rev_swig_ptr(sq.codes.data(), n * sq.code_size).reshape(n, sq.code_size)
    X = sq.sa_decode(np.ascontiguousarray(codes[pos])) if pos.size else np.zeros((0, coll.dim))
    entry = (seq_at[pos], X.astype(np.float32, copy=False), np.einsum("ij,ij->i", X, X))
    if X.nbytes <= DECODED_CACHE_BYTES:
        with coll.cache_lock:
            coll.decoded_cache[key] = entry
            total = sum(e[1].nbytes for e in coll.decoded_cache.values())
            while total > DECODED_CACHE_BYTES:
                total -= coll.decoded_cache.popitem(last=False)[1][1].nbytes
    return entry


def _found_mask(coll: Coll, found: np.ndarray) -> np.ndarray:
    mask = np.zeros(coll.live.capacity, dtype=bool)
    mask[found] = True
    return mask


def _fill_short(
    ctx: Context, coll: Coll, q: np.ndarray, k: int, found: np.ndarray | None,
    n_candidates: int, dist: np.ndarray, lab: np.ndarray,
) -> set[int]:
    """An approximate index may come back short under a filter or many tombstones: redo
    those rows exactly (in place) so top_k is filled. Returns the rows redone."""
    need = min(k, n_candidates)
    short = np.flatnonzero((lab >= 0).sum(axis=1) < need)
    if not short.size:
        return set()
    cand = found if found is not None else coll.live.to_array()
    dist[short], lab[short] = exact(ctx, coll, q[short], k, cand)
    return set(short.tolist())


def _raw_hits(coll: Coll, dist: np.ndarray, lab: np.ndarray) -> RawHits:
    id_of = coll.seq_to_id
    if coll.metric == Metric.L2:
        dist = -dist
    raw = []
    for drow, irow in zip(dist.tolist(), lab.tolist(), strict=True):
        hits = []
        for s, seq in zip(drow, irow, strict=True):
            if seq < 0:
                break
            item_id = id_of.get(seq)
            if item_id is not None:
                hits.append((seq, item_id, s))
        raw.append(hits)
    return raw


def _extras(
    ctx: Context, raw: RawHits, include_text: bool, include_metadata: bool
) -> dict[int, tuple[str, Any]]:
    """Text and metadata of the hits, by seq, when asked for."""
    extra: dict[int, tuple[str, Any]] = {}
    if not (include_text or include_metadata):
        return extra
    want = sorted({h[0] for hits in raw for h in hits})
    if want:
        for seq, text, md in repo.texts_of(ctx.reader(), want):
            extra[seq] = (
                text if include_text else "",
                json.loads(md) if include_metadata else {},
            )
    return extra


def exact(
    ctx: Context, coll: Coll, q: np.ndarray, k: int, seqs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of `q` over the vectors of `seqs` (live, indexed). Called under rw."""
    if fx.lossy(coll.built_type, coll.rparams):  # codes, not vectors: read the stored ones
        seqs, X = repo.vectors_of(ctx.reader(), seqs, coll.dim)
    else:
        X = coll.index.reconstruct_batch(seqs)
    kk = min(k, X.shape[0])
    dist = np.full(
        (q.shape[0], k), -np.inf if coll.metric != Metric.L2 else np.inf, dtype=np.float32
    )
    lab = np.full((q.shape[0], k), -1, dtype=np.int64)
    if kk:
        d, pos = faiss.knn(q, np.ascontiguousarray(X), kk, metric=fx.faiss_metric(coll.metric))
        dist[:, :kk] = d
        lab[:, :kk] = np.where(pos >= 0, seqs[np.maximum(pos, 0)], -1)
    return dist, lab
