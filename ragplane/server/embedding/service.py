"""Embedding orchestration: validation, limits, use-case routing, dynamic batching.

`EmbeddingService.embed` is what the Embed RPC, Upsert of text, Search by text and
Memory all call. Each case-of-use is answered by its serving embedder (the canonical
one, or embedder_rs after a flip); the shadow hook sees every answered batch and
decides on its own whether to sample it, off the request path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ragplane.core.errors import InvalidArgument
from ragplane.server.embedding.base import Embedder, l2_normalize
from ragplane.server.embedding.batcher import EmbedBatcher

DEFAULT_USE_CASE = "embeddings"


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray  # float32 [n, dim]
    dim: int
    model: str
    embedder: str  # name@version
    token_counts: list[int]


class ShadowHook(Protocol):
    def serving(self, use_case: str) -> str | None:
        """Identity of the embedder that should answer `use_case` now, or None = canonical."""
        ...

    def observe(
        self,
        use_case: str,
        texts: Sequence[str],
        vectors: np.ndarray,
        seconds: float,
        embedder: str,
        tokens: Sequence[int] = (),
    ) -> None:
        """Offer an answered batch (with each text's token count) to the shadow; must
        return at once."""
        ...


class EmbeddingService:
    def __init__(
        self,
        canonical: Embedder,
        *,
        max_batch_texts: int = 2048,
        max_text_bytes: int = 65536,
        batch_max_tokens: int = 16384,
        batch_max_wait_s: float = 0.002,
        queue_texts: int = 65536,
        use_cases: Sequence[str] = (DEFAULT_USE_CASE,),
        on_pass: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.canonical = canonical
        self.max_batch_texts = max_batch_texts
        self.max_text_bytes = max_text_bytes
        self.use_cases = set(use_cases) | {DEFAULT_USE_CASE}
        self._batch_args = dict(
            max_tokens=batch_max_tokens,
            max_wait_s=batch_max_wait_s,
            max_queue_texts=queue_texts,
            on_pass=on_pass,
        )
        self._embedders: dict[str, Embedder] = {canonical.identity: canonical}
        self._batchers: dict[str, EmbedBatcher] = {
            canonical.identity: EmbedBatcher(canonical, **self._batch_args)
        }
        self.shadow: ShadowHook | None = None

    @property
    def dim(self) -> int:
        return self.canonical.dim

    def register(self, embedder: Embedder) -> None:
        """Make another embedder (the Rust one, say) able to answer after a flip."""
        if embedder.dim != self.canonical.dim:
            raise ValueError(
                f"{embedder.identity} has dim {embedder.dim}, canonical has {self.canonical.dim}"
            )
        if embedder.identity not in self._batchers:
            self._embedders[embedder.identity] = embedder
            self._batchers[embedder.identity] = EmbedBatcher(embedder, **self._batch_args)

    def serving_embedder(self, use_case: str = DEFAULT_USE_CASE) -> Embedder:
        self._check_use_case(use_case)
        ident = self.shadow.serving(use_case) if self.shadow else None
        return self._embedders.get(ident or "", self.canonical)

    def batcher_for(self, embedder: Embedder) -> EmbedBatcher:
        return self._batchers[embedder.identity]

    @property
    def queued_texts(self) -> int:
        return sum(b.queued_texts for b in self._batchers.values())

    def validate_texts(
        self, texts: Sequence[str], *, allow_empty_text: bool = True, field: str = "texts"
    ) -> None:
        """Raises InvalidArgument naming the request's `field` (`texts` over gRPC, `input`
        over HTTP) and the limit it broke."""
        if not texts:
            raise InvalidArgument(f"{field} is empty; send at least one text")
        if len(texts) > self.max_batch_texts:
            raise InvalidArgument(
                f"{len(texts)} texts in one request; the limit is {self.max_batch_texts}. "
                "Split the batch" + (" or use EmbedStream" if field == "texts" else "")
            )
        for i, t in enumerate(texts):
            size = len(t.encode("utf-8", "surrogatepass"))
            if size > self.max_text_bytes:
                raise InvalidArgument(
                    f"{field}[{i}] is {size} bytes; the limit is {self.max_text_bytes} bytes "
                    "(max_text_bytes)"
                )
            if not allow_empty_text and not t.strip():
                raise InvalidArgument(f"{field}[{i}] is empty")

    def embed(
        self,
        texts: Sequence[str],
        *,
        normalize: bool = True,
        truncate: bool = True,
        use_case: str = DEFAULT_USE_CASE,
        is_active: Callable[[], bool] = lambda: True,
        allow_empty_text: bool = True,
        field: str = "texts",
    ) -> EmbedResult:
        self.validate_texts(texts, allow_empty_text=allow_empty_text, field=field)
        embedder = self.serving_embedder(use_case or DEFAULT_USE_CASE)
        if truncate:
            tokens = embedder.count_tokens(texts)
        else:
            full = embedder.count_tokens_untruncated(texts)
            for i, n in enumerate(full):
                if n > embedder.max_seq_length:
                    raise InvalidArgument(
                        f"{field}[{i}] has {n} tokens, over the model's max_seq_length "
                        f"{embedder.max_seq_length}, and truncate is false; shorten it or "
                        "set truncate=true"
                    )
            tokens = full
        t0 = time.perf_counter()
        raw = self.batcher_for(embedder).embed(texts, tokens, normalize=False, is_active=is_active)
        seconds = time.perf_counter() - t0
        if self.shadow is not None:
            self.shadow.observe(
                use_case or DEFAULT_USE_CASE, texts, raw, seconds, embedder.identity, tokens
            )
        vectors = l2_normalize(raw) if normalize else raw
        return EmbedResult(
            vectors=vectors,
            dim=embedder.dim,
            model=embedder.model,
            embedder=embedder.identity,
            token_counts=list(tokens),
        )

    def _check_use_case(self, use_case: str) -> None:
        if use_case not in self.use_cases:
            raise InvalidArgument(
                f"use_case {use_case!r} is not declared; known: {', '.join(sorted(self.use_cases))}"
            )

    def close(self) -> None:
        for b in self._batchers.values():
            b.close()
