"""Embedding orchestration: validation, limits, use-case routing, dynamic batching.

`EmbeddingService.embed` is what the Embed RPC, Upsert of text, Search by text, Memory
and the HTTP API all call. Each case-of-use is answered by its serving embedder (the
canonical one, or embedder_rs after a flip); the shadow hook sees every answered batch and
decides on its own whether to sample it, off the request path.

Every batch is checked before it leaves (right count, right dimension, every value
finite: one pass over the floats), whichever embedder served it. A flipped shadow's bad
batch is answered by the canonical instead, and the hook hears of it at once (a watch
error, an unflip); the canonical's own bad batch is an error, never a reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ragplane.core.errors import InvalidArgument, RagplaneError, Unavailable
from ragplane.server.embedding.base import Embedder, l2_normalize
from ragplane.server.embedding.batcher import BadEmbedderOutput, EmbedBatcher

DEFAULT_USE_CASE = "embeddings"
log = logging.getLogger(__name__)


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

    def serving_failed(
        self, use_case: str, embedder: str, texts: Sequence[str], tokens: Sequence[int], why: str
    ) -> None:
        """`embedder`, serving `use_case`, returned a batch the service refused (`why`);
        the canonical answered instead."""
        ...


def _embedder_fault(exc: BaseException) -> bool:
    """An exception that says the embedder failed, not the call (a deadline, a full
    queue, a bad request: those go to the caller as they are)."""
    return not isinstance(exc, RagplaneError | TimeoutError)


def check_batch(vectors: np.ndarray, n: int, dim: int) -> str:
    """Why `vectors` is not `n` finite rows of `dim` values ("" when it is)."""
    shape = getattr(vectors, "shape", None)
    if shape != (n, dim):
        return f"shape {shape}, expected ({n}, {dim})"
    if not np.isfinite(vectors).all():
        rows = int((~np.isfinite(vectors).all(axis=1)).sum())
        return f"non-finite values in {rows} of {n} vectors"
    return ""


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
        use_case = use_case or DEFAULT_USE_CASE
        t0 = time.perf_counter()
        try:
            raw = self.batcher_for(embedder).embed(
                texts, tokens, normalize=False, is_active=is_active
            )
            why = check_batch(raw, len(texts), embedder.dim)
        except BadEmbedderOutput as exc:
            raw, why = None, str(exc)
        except Exception as exc:
            if embedder is self.canonical or not _embedder_fault(exc):
                raise
            raw, why = None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - t0
        if why:
            embedder, raw = self._fall_back(embedder, use_case, texts, tokens, why, is_active)
        elif self.shadow is not None:
            self.shadow.observe(use_case, texts, raw, seconds, embedder.identity, tokens)
        vectors = l2_normalize(raw) if normalize else raw
        return EmbedResult(
            vectors=vectors,
            dim=embedder.dim,
            model=embedder.model,
            embedder=embedder.identity,
            token_counts=list(tokens),
        )

    def _fall_back(
        self,
        embedder: Embedder,
        use_case: str,
        texts: Sequence[str],
        tokens: Sequence[int],
        why: str,
        is_active: Callable[[], bool],
    ) -> tuple[Embedder, np.ndarray]:
        """The canonical's answer for a batch `embedder` got wrong. Raises Unavailable when
        the canonical itself was wrong, or is wrong too: no bad vector is ever returned."""
        if embedder is self.canonical:
            raise Unavailable(f"the embedder {embedder.identity} returned {why}; retry later")
        if self.shadow is not None:
            try:
                self.shadow.serving_failed(use_case, embedder.identity, texts, tokens, why)
            except Exception:  # the caller still gets the canonical's answer
                log.exception("recording %s's refused batch failed", embedder.identity)
        canonical = self.canonical
        raw = self.batcher_for(canonical).embed(texts, tokens, normalize=False, is_active=is_active)
        if again := check_batch(raw, len(texts), canonical.dim):
            raise Unavailable(f"the embedder {canonical.identity} returned {again}; retry later")
        return canonical, raw

    def _check_use_case(self, use_case: str) -> None:
        if use_case not in self.use_cases:
            raise InvalidArgument(
                f"use_case {use_case!r} is not declared; known: {', '.join(sorted(self.use_cases))}"
            )

    def close(self) -> None:
        for b in self._batchers.values():
            b.close()
