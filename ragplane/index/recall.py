"""The recall check that gates a generation swap, measured with held-out queries.

A query that is itself an indexed vector flatters an approximate index: HNSW links every
node to its nearest neighbours, so the graph's answer for a node is nearly its exact one
(recall 0.9995-1.0 where new queries got 0.952-0.994, issue 41). So a rebuild holds a
seeded sample of the collection's vectors out of the index while it is checked: they are
queries from the data's own distribution that the index has never seen, and they join the
index right after (`held_out` picks them, `recall_at_k` measures). The search measured is
the serving one, rescoring included.
"""

from __future__ import annotations

from collections.abc import Callable

import faiss
import numpy as np

from ragplane.index.types import Metric

RECALL_K = 10
RECALL_SAMPLE = 500

# queries [nq, dim], k -> the ids found [nq, k], -1 padded
SearchFn = Callable[[np.ndarray, int], np.ndarray]


def held_out(n: int, sample: int = RECALL_SAMPLE, seed: int = 0) -> np.ndarray:
    """A boolean mask of the (seeded) rows of `n` to hold out of the index while its recall
    is checked: at most `sample`, and at most a fifth of the rows, so small collections
    keep most of theirs in the index that is measured."""
    mask = np.zeros(n, dtype=bool)
    m = min(sample, n // 5)
    if m:
        mask[np.random.default_rng(seed).choice(n, size=m, replace=False)] = True
    return mask


def recall_at_k(
    search: SearchFn,
    queries: np.ndarray,
    vectors: np.ndarray,
    ids: np.ndarray,
    metric: Metric,
    *,
    k: int = RECALL_K,
) -> float:
    """Mean recall@k of `search` for `queries` against exact search over (`vectors`, `ids`),
    which is what the index holds (`ids` ascending, store sequence order).

    Ties at the k-th exact score count as hits, so an index that returns any of several
    equally-near items is not penalised. Returns 1.0 when there is nothing to check.
    """
    n = vectors.shape[0]
    if n == 0 or queries.shape[0] == 0:
        return 1.0
    k = min(k, n)
    l2 = metric == Metric.L2
    got = search(queries, k)
    exact_d, _ = faiss.knn(queries, vectors, k, metric=faiss.METRIC_L2 if l2 else
                           faiss.METRIC_INNER_PRODUCT)
    kth = -exact_d[:, k - 1] if l2 else exact_d[:, k - 1]  # the k-th best exact score
    tol = 1e-5 * np.maximum(1.0, np.abs(kth))
    hits = 0
    for row in range(queries.shape[0]):
        g = got[row][got[row] >= 0]
        pos = np.minimum(np.searchsorted(ids, g), n - 1)
        x = vectors[pos[ids[pos] == g]]
        scores = x @ queries[row]
        if l2:
            scores = 2 * scores - (x * x).sum(axis=1) - float(queries[row] @ queries[row])
        hits += int(np.count_nonzero(scores >= kth[row] - tol[row]))
    return float(min(1.0, hits / (queries.shape[0] * k)))
