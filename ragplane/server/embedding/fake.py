"""A deterministic, model-free embedder for tests.

Vectors are a sum of per-word pseudo-random unit vectors (seeded by a hash of the word),
so texts that share words are close, identical texts are identical, and results never
depend on a model or a machine.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import numpy as np

from ragplane.server.embedding.base import Identified, l2_normalize


class FakeEmbedder(Identified):
    name = "fake"
    model = "fake-hash"
    device = "cpu"

    def __init__(
        self, dim: int = 64, max_seq_length: int = 256, version: str = "1", delay_s: float = 0.0
    ) -> None:
        self.dim = dim
        self.max_seq_length = max_seq_length
        self.version = version
        self.delay_s = delay_s  # to simulate a slow model in tests
        self._cache: dict[str, np.ndarray] = {}


    def _word(self, word: str) -> np.ndarray:
        vec = self._cache.get(word)
        if vec is None:
            seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            vec = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            self._cache[word] = vec
        return vec

    def _words(self, text: str) -> list[str]:
        return text.lower().split()[: self.max_seq_length - 2]

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        if self.delay_s:
            time.sleep(self.delay_s)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in self._words(text):
                out[i] += self._word(w)
            if not text.strip():
                out[i] = self._word("\0empty")
        return l2_normalize(out) if normalize else out

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) + 2 for t in texts]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [min(n, self.max_seq_length) for n in self.count_tokens_untruncated(texts)]
