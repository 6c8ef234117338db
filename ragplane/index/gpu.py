"""Unfiltered searches of flat indexes on a GPU copy, when FAISS can (faiss-gpu and a device).

Searches with ID selectors (filters, tombstones) stay on the CPU index, which remains the
one that is written and checkpointed.
"""

from __future__ import annotations

import threading
from typing import Any

import faiss
import numpy as np

# FAISS GPU indexes answer at most this many neighbours per query.
GPU_MAX_K = 2048


def faiss_gpu_available() -> bool:
    """Whether this FAISS build has GPU support (faiss-gpu, the [gpu] extra) and sees a GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class GpuCopies:
    """GPU copies of flat CPU indexes, copied again once rows were added or the index was
    replaced (flat indexes only grow in place)."""

    def __init__(self) -> None:
        self._res: Any = faiss.StandardGpuResources()
        # one GPU resource object is not safe for concurrent use: copies and searches queue
        self._lock = threading.Lock()
        self._copies: dict[int, tuple[Any, int, Any]] = {}  # coll id -> (cpu, ntotal, gpu)

    def search(
        self, coll_id: int, index: Any, q: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Search the GPU copy of `index`. Called under the collection's rw (read)."""
        with self._lock:
            cached = self._copies.get(coll_id)
            if cached is None or cached[0] is not index or cached[1] != index.ntotal:
                gpu = faiss.index_cpu_to_gpu(self._res, 0, index)
                cached = (index, index.ntotal, gpu)
                self._copies[coll_id] = cached
            dist, ids = cached[2].search(q, k)
            return dist, ids
