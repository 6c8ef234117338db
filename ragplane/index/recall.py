"""The recall check that gates a generation swap."""

from __future__ import annotations

import faiss
import numpy as np

RECALL_K = 10
RECALL_SAMPLE = 200

def recall_at_k(
    index: faiss.Index,
    vectors: np.ndarray,
    ids: np.ndarray,
    metric: int,
    search_params: object | None,
    *,
    k: int = RECALL_K,
    sample: int = RECALL_SAMPLE,
    seed: int = 0,
) -> float:
    """Mean recall@k of `index` against exact search over (`vectors`, `ids`).

    Queries are a seeded sample of the indexed vectors themselves. Ties at the k-th exact
    score count as hits, so an index that returns any of several equally-near items is not
    penalised. Returns 1.0 when there is nothing to check.
    """
    n = vectors.shape[0]
    if n == 0:
        return 1.0
    k = min(k, n)
    rng = np.random.default_rng(seed)
    q = vectors[rng.choice(n, size=min(sample, n), replace=False)]
    if metric == faiss.METRIC_L2:
        exact_d, exact_i = faiss.knn(q, vectors, k, metric=faiss.METRIC_L2)
    else:
        exact_d, exact_i = faiss.knn(q, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)
    _, got = index.search(q, k, params=search_params)
    # A returned id counts as a hit when its exact score is at least the k-th exact score:
    # ties at the boundary are not misses. `ids` are ascending (store sequence order).
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    hits = 0
    for row in range(q.shape[0]):
        got_row = got[row][got[row] >= 0]
        pos = np.searchsorted(sorted_ids, got_row)
        pos = np.minimum(pos, n - 1)
        found = sorted_ids[pos] == got_row
        vecs = vectors[order[pos[found]]]
        if metric == faiss.METRIC_L2:
            scores = -((vecs - q[row]) ** 2).sum(axis=1)
            kth = -exact_d[row, k - 1]
        else:
            scores = vecs @ q[row]
            kth = exact_d[row, k - 1]
        tol = 1e-5 * max(1.0, abs(float(kth)))
        hits += int(np.count_nonzero(scores >= kth - tol))
    return min(1.0, hits / (q.shape[0] * k))
