"""Fusing a dense and a lexical ranking into one: reciprocal rank fusion or a weighted sum
of min-max normalised scores.

Pure functions over (id, score) lists, higher score better in both. Each list is ranked by
(-score, id), so equal scores get distinct ranks in id order and the fused order never
depends on the order the candidates arrived in; fused ties are broken the same way.

RRF (Cormack, Clarke and Buettcher, SIGIR 2009): fused = w_d / (k + r_d) + w_l / (k + r_l),
ranks from 1, a term dropped where the item is not in that ranking. With w_d = 2 * w and
w_l = 2 * (1 - w), w = 0.5 is the paper's formula; the scores' scales never matter.

Weighted (Weaviate's relative-score fusion): fused = w * d' + (1 - w) * l', where d' and l'
are the scores min-max normalised to [0, 1] over that ranking's candidates (all 1.0 when they
are equal) and 0 where the item is not a candidate of that ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from ragplane.core.errors import InvalidArgument
from ragplane.index.types import Fusion, FusionMethod

DEFAULT_RRF_K = 60
MAX_RRF_K = 1_000_000


class Fused(NamedTuple):
    """One fused candidate. `dense` / `lexical` are its scores in the two input rankings,
    None where it was not among that ranking's candidates; ranks likewise (from 1). A
    tuple: a chunked hybrid search fuses hundreds of rows per query."""

    id: Any  # what the caller ranked by: an item id, or (item id, seq) for chunks
    score: float
    dense: float | None
    lexical: float | None
    dense_rank: int | None
    lexical_rank: int | None


def check(fusion: Fusion) -> Fusion:
    """`fusion` if its parameters are usable; InvalidArgument naming the bad one otherwise."""
    if not 0 < fusion.rrf_k <= MAX_RRF_K:
        raise InvalidArgument(
            f"fusion.rrf_k must be in 1..{MAX_RRF_K} (0 = 60), got {fusion.rrf_k}"
        )
    w = fusion.dense_weight
    if not 0.0 <= w <= 1.0:  # also refuses NaN
        raise InvalidArgument(f"fusion.dense_weight must be in [0, 1], got {w}")
    return fusion


def _ranked(scored: Sequence[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """id -> (rank from 1, score); a repeated id keeps its best score."""
    best: dict[str, float] = {}
    for id_, s in scored:
        if id_ not in best or s > best[id_]:
            best[id_] = s
    return {id_: (rank, s) for rank, (id_, s) in enumerate(_best_first(best), start=1)}


def _best_first(scores: dict[Any, float]) -> list[tuple[Any, float]]:
    """(id, score) by score, best first, then by id: two sorts in C (the second stable),
    where one keyed on (-score, id) calls a lambda per row."""
    order = sorted(scores.items(), key=itemgetter(0))
    order.sort(key=itemgetter(1), reverse=True)
    return order


def _normalised(ranked: dict[str, tuple[int, float]]) -> dict[str, float]:
    if not ranked:
        return {}
    scores = [s for _, s in ranked.values()]
    lo, hi = min(scores), max(scores)
    if hi == lo:
        return dict.fromkeys(ranked, 1.0)
    return {id_: (s - lo) / (hi - lo) for id_, (_, s) in ranked.items()}


def fuse(
    dense: Sequence[tuple[Any, float]],
    lexical: Sequence[tuple[Any, float]],
    fusion: Fusion,
    top_k: int | None = None,
) -> list[Fused]:
    """The union of both candidate lists ordered by fused score (then id), at most top_k.

    `dense` and `lexical` are (id, score) pairs, higher better, in any order; scores must be
    finite; `fusion` has passed check(). A candidate of one list only keeps None for the
    other's score and rank."""
    d, lx = _ranked(dense), _ranked(lexical)
    w = fusion.dense_weight
    fused: dict[str, float] = {}
    if fusion.method is FusionMethod.RRF:
        k = fusion.rrf_k
        for id_, (rank, _) in d.items():
            fused[id_] = 2.0 * w / (k + rank)
        for id_, (rank, _) in lx.items():
            fused[id_] = fused.get(id_, 0.0) + 2.0 * (1.0 - w) / (k + rank)
    else:
        nd, nl = _normalised(d), _normalised(lx)
        for id_ in d.keys() | lx.keys():
            fused[id_] = w * nd.get(id_, 0.0) + (1.0 - w) * nl.get(id_, 0.0)
    order = _best_first(fused)
    if top_k is not None:
        order = order[:top_k]
    out = []
    for id_, score in order:
        dr, lr = d.get(id_), lx.get(id_)
        out.append(Fused(id_, score, dr[1] if dr else None, lr[1] if lr else None,
                         dr[0] if dr else None, lr[0] if lr else None))
    return out


class FusedRows:
    """Rows (chunks) fused, best first: `rows()` as (seq, item id, fused score) for grouping,
    and `get(seq)` one row's Fused, made only for the rows a caller keeps."""

    def __init__(self, seqs: np.ndarray, items: list[str], scores: np.ndarray,
                 detail: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.seqs = seqs.tolist()
        self.items = items
        self.scores = scores.tolist()
        self._detail = detail  # dense score, lexical score (NaN: not ranked), their ranks
        self._at = {s: i for i, s in enumerate(self.seqs)}

    def __len__(self) -> int:
        return len(self.seqs)

    def rows(self) -> list[tuple[int, str, float]]:
        return list(zip(self.seqs, self.items, self.scores, strict=True))

    def get(self, seq: int) -> Fused:
        i = self._at[seq]
        d, lx, dr, lr = (float(a[i]) for a in self._detail)
        return Fused((self.items[i], seq), self.scores[i], None if not dr else d,
                     None if not lr else lx, int(dr) or None, int(lr) or None)

    def all(self) -> list[Fused]:
        return [self.get(s) for s in self.seqs]


def fuse_rows(
    dense: Sequence[tuple[int, str, float]],
    lexical: Sequence[tuple[int, str, float]],
    fusion: Fusion,
) -> FusedRows:
    """`fuse` of two rankings of rows (chunks), each (seq, item id, score) with every seq at
    most once per ranking, keyed (item id, seq): the same candidates, scores, ranks and
    order as `fuse([((item, seq), score), ...], ...)`, computed in arrays (a chunked
    collection's hybrid search fuses hundreds of rows per query)."""
    items = sorted({r[1] for r in dense} | {r[1] for r in lexical})
    code = {item: i for i, item in enumerate(items)}
    nd = len(dense)
    seq = np.fromiter((r[0] for rows in (dense, lexical) for r in rows), np.int64)
    item = np.fromiter((code[r[1]] for rows in (dense, lexical) for r in rows), np.int64)
    score = np.fromiter((r[2] for rows in (dense, lexical) for r in rows), np.float64)
    uniq, at = np.unique(seq, return_inverse=True)
    m = uniq.size
    item_of = np.empty(m, np.int64)
    item_of[at] = item
    parts = []
    for lo, hi in ((0, nd), (nd, seq.size)):
        s = score[lo:hi]
        order = np.lexsort((seq[lo:hi], item[lo:hi], -s))  # best first, then by (item, seq)
        rank = np.zeros(m, np.int64)
        rank[at[lo:hi][order]] = np.arange(1, hi - lo + 1)
        got = np.full(m, np.nan)
        got[at[lo:hi]] = s
        parts.append((rank, got))
    (d_rank, d_score), (l_rank, l_score) = parts
    w = fusion.dense_weight
    if fusion.method is FusionMethod.RRF:
        k = fusion.rrf_k
        fused = np.where(d_rank > 0, 2.0 * w / (k + d_rank), 0.0)
        fused = fused + np.where(l_rank > 0, 2.0 * (1.0 - w) / (k + l_rank), 0.0)
    else:
        fused = w * _normalised_array(d_score) + (1.0 - w) * _normalised_array(l_score)
    order = np.lexsort((uniq, item_of, -fused))
    return FusedRows(uniq[order], [items[c] for c in item_of[order].tolist()], fused[order],
                     (d_score[order], l_score[order], d_rank[order], l_rank[order]))


def _normalised_array(scores: np.ndarray) -> np.ndarray:
    """`_normalised` over an array with NaN for rows not ranked (which get 0)."""
    present = ~np.isnan(scores)
    if not present.any():
        return np.zeros(scores.size)
    lo, hi = scores[present].min(), scores[present].max()
    if hi == lo:
        same: np.ndarray = present.astype(np.float64)
        return same
    out: np.ndarray = np.where(present, (scores - lo) / (hi - lo), 0.0)
    return out
