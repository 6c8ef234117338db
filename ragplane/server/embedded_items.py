"""Text made into stored vectors, once for collections and memory namespaces: which
embedder may embed for a store, chunks at its window, and embedding in requests the
embedding service accepts.

A collection or a namespace records the embedder (name@version) whose vectors it holds.
Vectors of another embedder are mixed into it, or compared with it as a query, only when
the shadow says the pair agrees (G1): after a flip the new serving embedder may be one whose
vectors rank differently, and a store of mixed vectors answers neither embedder's queries
well. Otherwise the call is refused with FAILED_PRECONDITION naming both embedders and what
the caller can do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ragplane.core.errors import FailedPrecondition
from ragplane.index.types import Chunking, Span
from ragplane.server import chunking
from ragplane.server.embedding.base import Embedder
from ragplane.server.embedding.service import EmbeddingService

Compatible = Callable[[str, str], bool]
Active = Callable[[], bool]


class ItemEmbedding:
    """The embedding service as stores use it. `compatible(a, b)`: may vectors of `a` and
    `b` be mixed (the shadow's G1, wired at start); until then only the same embedder."""

    def __init__(self, embedding: EmbeddingService, compatible: Compatible | None = None) -> None:
        self.embedding = embedding
        self._compatible = compatible or (lambda a, b: a == b)

    def set_compatibility(self, compatible: Compatible) -> None:
        self._compatible = compatible

    def embedder_for(self, stored: str, subject: str, what: str, remedy: str) -> Embedder:
        """The serving embedder, if its vectors may join those of `stored` (the store's
        embedder identity). `subject` names the store ("collection 'kb'"), `what` the text
        ("the query text"), `remedy` what the caller can do instead."""
        embedder = self.embedding.serving_embedder()
        if stored != embedder.identity and not self._compatible(stored, embedder.identity):
            raise FailedPrecondition(
                f"{subject} holds vectors of {stored}, but {what} would be embedded by "
                f"{embedder.identity}, and that pair has not passed the agreement gate (G1); "
                f"{remedy}"
            )
        return embedder

    def chunks(
        self, texts: Sequence[str], rule: Chunking, embedder: Embedder, is_active: Active
    ) -> tuple[list[list[Span]], str]:
        """Each text split at `rule`'s window by `embedder`'s own tokenizer, every chunk
        embedded alone: per text its Spans (character offsets and vector), and the identity
        of the embedder that embedded them."""
        spans = chunking.chunker_for(embedder).spans(list(texts), rule)
        pieces = [t[s:e] for t, sp in zip(texts, spans, strict=True) for s, e in sp]
        vectors, identity = self.embed_all(pieces, is_active)
        out, row = [], 0
        for sp in spans:
            out.append([Span(s, e, vectors[row + j]) for j, (s, e) in enumerate(sp)])
            row += len(sp)
        return out, identity

    def embed_all(self, texts: Sequence[str], is_active: Active) -> tuple[np.ndarray, str]:
        """Embed any number of texts, in requests the embedding service accepts: (n, dim)
        vectors and the identity of the embedder that made them."""
        step = self.embedding.max_batch_texts
        parts, identity = [], ""
        for lo in range(0, len(texts), step):
            result = self.embedding.embed(list(texts[lo : lo + step]), is_active=is_active)
            parts.append(result.vectors)
            identity = result.embedder
        return np.concatenate(parts), identity
