"""A small offline embedding for the LlamaIndex tests."""

from __future__ import annotations

import hashlib
import math
import re

from llama_index.core.base.embeddings.base import BaseEmbedding


class WordsEmbedding(BaseEmbedding):
    """Bag of words hashed into `dim` dimensions, L2-normalised: texts that share words are
    close. 96-dim, so a collection of its vectors holds callers' vectors (the test server's
    fake embedder is 64-dim)."""

    dim: int = 96

    @classmethod
    def class_name(cls) -> str:
        return "WordsEmbedding"

    def vector(self, text: str) -> list[float]:
        v = [0.0] * self.dim
        for w in re.findall(r"\w+", text.lower()):
            h = hashlib.blake2b(w.encode(), digest_size=4).digest()
            v[int.from_bytes(h, "little") % self.dim] += 1.0
        n = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / n for x in v]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self.vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self.vector(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self.vector(query)
