"""Hits are items: rankings of rows (one per chunk) grouped into items, each ranked by its
best chunk and carrying its best chunks as passages.

A collection whose items were split holds several rows per item, so a ranking of rows must
be read deeper than top_k to find top_k items: `depths` gives the depths to try, and the
caller stops at the first that yields top_k items or exhausts the candidates. Because an
item ranks by its best chunk, the first top_k distinct items of an exact row ranking are
exactly the top_k items: grouping keeps a dense ranking's exactness.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ragplane.core.errors import InvalidArgument
from ragplane.index import repository as repo
from ragplane.index.types import ChunkHit, Metric

MAX_CHUNKS_PER_HIT = 16

Row = tuple[int, str, float]  # (seq, item id, score), best first


def check_chunks_per_hit(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_CHUNKS_PER_HIT:
        raise InvalidArgument(
            f"chunks_per_hit must be from 0 to {MAX_CHUNKS_PER_HIT} (0 = 1), got {n!r}"
        )
    return n or 1


def depths(top_k: int, per_hit: int, n_rows: int) -> Iterator[int]:
    """Row depths to read for top_k items: from a few rows per item up to every row."""
    k = max(top_k, min(n_rows, top_k * max(4, 2 * per_hit)))
    while True:
        yield k
        if k >= n_rows:
            return
        k = min(n_rows, k * 4)


Group = tuple[str, list[tuple[int, float]]]  # (item id, its rows (seq, score), best first)


def group(rows: Sequence[Row], top_k: int, per_hit: int) -> list[Group]:
    """The first `top_k` distinct items of `rows` in rank order, each with up to `per_hit`
    of its rows (seq, score), best first."""
    chosen: dict[str, list[tuple[int, float]]] = {}
    for seq, item_id, score in rows:
        got = chosen.get(item_id)
        if got is None:
            if len(chosen) == top_k:
                continue
            got = chosen[item_id] = []
        if len(got) < per_hit:
            got.append((seq, score))
    return list(chosen.items())


def passages(
    conn: Any, groups: Sequence[Sequence[tuple[int, float]]], include_text: bool,
    include_metadata: bool, whole_text: bool,
) -> tuple[list[tuple[ChunkHit, ...]], dict[int, tuple[str, Any]]]:
    """For each group's rows: its chunk hits (none for rows without offsets, written before
    chunking or in a collection without it), and, by the group's first seq, the item's whole
    text (when `whole_text`) and metadata (when `include_metadata`)."""
    seqs = [s for g in groups for s, _ in g]
    if not seqs:
        return [() for _ in groups], {}
    info = {r[0]: r for r in repo.hit_rows(conn, seqs, whole_text)}
    out: list[tuple[ChunkHit, ...]] = []
    extra: dict[int, tuple[str, Any]] = {}
    for g in groups:
        hits = []
        for seq, score in g:
            r = info.get(seq)
            if r is not None and r[3] >= 0:
                hits.append(ChunkHit(r[1], r[2], r[3], score, r[4] if include_text else ""))
        out.append(tuple(hits))
        head = info.get(g[0][0]) if g else None
        if head is not None:
            extra[g[0][0]] = (
                head[6] if whole_text else "",
                json.loads(head[5]) if include_metadata else {},
            )
    return out, extra


def scores(metric: Metric, X: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Dense scores of stored vectors X [n, dim] for the query q [dim], as FAISS reports
    them (higher is better; l2: -squared distance)."""
    out: np.ndarray = -np.sum((X - q) ** 2, axis=1) if metric == Metric.L2 else X @ q
    return out


def best_chunks(
    conn: Any, coll_id: int, items: Sequence[Group], per_hit: int,
    score: Callable[[np.ndarray], np.ndarray], dim: int,
) -> list[Group]:
    """`items` with each item's best `per_hit` live chunks, scored exactly from their stored
    vectors by `score` (a ranking read only so deep may have missed some)."""
    if not items:
        return []
    rows = repo.item_seqs(conn, coll_id, [i for i, _ in items])
    seqs = np.asarray([s for s, _ in rows], dtype=np.int64)
    found, X = repo.vectors_of(conn, seqs, dim)
    owner = dict(rows)
    by_item: dict[str, list[tuple[int, float]]] = {}
    for seq, s in zip(found.tolist(), score(X).tolist(), strict=True):
        by_item.setdefault(owner[seq], []).append((seq, s))
    out = []
    for item_id, g in items:
        ranked = sorted(by_item.get(item_id, g), key=lambda r: -r[1])[:per_hit]
        out.append((item_id, ranked or g))
    return out
