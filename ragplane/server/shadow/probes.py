"""overlap@10 of a case's probe set: sampled texts with both embedders' vectors, each text
searched over the others with each embedder's own vectors (exact search, the text itself
left out), and the two top-10s compared. A reservoir keeps at most `cap` texts."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import numpy as np

from ragplane.server.embedding.base import l2_normalize


class ProbeSet:
    def __init__(self, cap: int, rng: random.Random) -> None:
        self.cap = cap
        self._rng = rng
        self._lock = threading.Lock()
        self._items: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, texts: Sequence[str], canon: np.ndarray, shadow: np.ndarray) -> None:
        """`canon`, `shadow`: float32 [len(texts), dim], any norm."""
        with self._lock:
            for t, c, s in zip(texts, l2_normalize(canon), l2_normalize(shadow), strict=True):
                if t in self._items or not t.strip():
                    continue
                if len(self._items) >= self.cap:  # reservoir: replace a random one
                    del self._items[self._rng.choice(list(self._items))]
                self._items[t] = (c, s)

    def overlap(self, queries: int) -> tuple[float, int]:
        """(overlap@10 averaged over up to `queries` probes, the probes used); (0.0, 0)
        while fewer than 12 texts are held."""
        with self._lock:
            items = list(self._items.values())
        if len(items) < 12:
            return 0.0, 0
        canon = np.stack([c for c, _ in items])
        shadow = np.stack([s for _, s in items])
        nq = min(queries, len(items))
        total = 0.0
        for i in range(nq):
            sc, ss = canon @ canon[i], shadow @ shadow[i]
            sc[i] = ss[i] = -np.inf
            top_c = set(np.argpartition(-sc, 10)[:10].tolist())
            top_s = set(np.argpartition(-ss, 10)[:10].tolist())
            total += len(top_c & top_s) / 10
        return total / nq, nq
