"""Exact rescoring of an index's candidates, as Qdrant rescores quantized search.

An index of lossy codes (int8 scalar quantization, IVF-PQ) ranks well enough to find the
neighbourhood but not to order it: it hands `top_k x oversampling` candidates to
`rescore`, which scores them with the float vectors the store keeps and returns the
best `k`. The serving path reads those vectors from SQLite; the recall check of a rebuild
passes the vectors it has in memory, so both measure the same ranking.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ragplane.index.types import Metric

# seqs (sorted, unique) -> (the seqs found, sorted; their float32 vectors [n, dim])
VectorsOf = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def rescore(
    q: np.ndarray, cand: np.ndarray, vectors_of: VectorsOf, k: int, metric: Metric
) -> tuple[np.ndarray, np.ndarray]:
    """The best `k` of each row's candidates `cand` ([nq, kk] ids, -1 padded) for the
    queries `q` ([nq, dim], prepared), scored exactly, in FAISS's convention: distances
    (inner product higher-better, squared L2 lower-better) and ids, -1 padded.
    Candidates `vectors_of` does not find (deleted meanwhile) are dropped."""
    nq = q.shape[0]
    l2 = metric == Metric.L2
    dist = np.full((nq, k), np.inf if l2 else -np.inf, dtype=np.float32)
    lab = np.full((nq, k), -1, dtype=np.int64)
    wanted = np.unique(cand[cand >= 0])
    if not wanted.size:
        return dist, lab
    seqs, vecs = vectors_of(wanted)
    if not seqs.size:
        return dist, lab
    for row in range(nq):
        c = cand[row][cand[row] >= 0]
        pos = np.minimum(np.searchsorted(seqs, c), seqs.size - 1)
        pos = pos[seqs[pos] == c]
        x = vecs[pos]
        scores = x @ q[row]
        if l2:  # ranked on the negated squared distance
            scores = 2 * scores - (x * x).sum(axis=1) - float(q[row] @ q[row])
        best = np.argsort(-scores, kind="stable")[:k]
        n = best.size
        lab[row, :n] = seqs[pos[best]]
        dist[row, :n] = -scores[best] if l2 else scores[best]
    return dist, lab
