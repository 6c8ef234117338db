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
from dataclasses import dataclass
from typing import Any

from ragplane.core.errors import InvalidArgument
from ragplane.index.types import Fusion, FusionMethod

DEFAULT_RRF_K = 60
MAX_RRF_K = 1_000_000


@dataclass(frozen=True)
class Fused:
    """One fused candidate. `dense` / `lexical` are its scores in the two input rankings,
    None where it was not among that ranking's candidates; ranks likewise (from 1)."""

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
    order = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))
    return {id_: (rank, s) for rank, (id_, s) in enumerate(order, start=1)}


def _normalised(ranked: dict[str, tuple[int, float]]) -> dict[str, float]:
    if not ranked:
        return {}
    scores = [s for _, s in ranked.values()]
    lo, hi = min(scores), max(scores)
    if hi == lo:
        return dict.fromkeys(ranked, 1.0)
    return {id_: (s - lo) / (hi - lo) for id_, (_, s) in ranked.items()}


def fuse(
    dense: Sequence[tuple[str, float]],
    lexical: Sequence[tuple[str, float]],
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
    order = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
    if top_k is not None:
        order = order[:top_k]
    return [
        Fused(
            id=id_,
            score=score,
            dense=d[id_][1] if id_ in d else None,
            lexical=lx[id_][1] if id_ in lx else None,
            dense_rank=d[id_][0] if id_ in d else None,
            lexical_rank=lx[id_][0] if id_ in lx else None,
        )
        for id_, score in order
    ]
