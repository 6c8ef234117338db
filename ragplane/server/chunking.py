"""Chunking: where an item's text is split before embedding, by its collection's settings.

Splitting is `semantic-text-splitter` (Rust text-splitter): the largest semantic unit that
fits (paragraphs, then sentences, then words; Markdown's sections first with the markdown
splitter), sized in tokens of the collection's embedder, counted with the model's own
tokenizer. Only the server knows that tokenizer and window, which is why the data plane
chunks and not its callers.

A text that fits the window is one chunk covering it whole, embedded exactly as before
chunking existed. A longer one becomes spans `text[start:end]` (offsets in code points,
each chunk at most `max_tokens` tokens with the special tokens the model adds).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from semantic_text_splitter import MarkdownSplitter, TextSplitter

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.index.types import Chunking, Splitter

DEFAULT_OVERLAP_DIVISOR = 8  # overlap unset: max_tokens / 8 tokens shared by neighbours
# min_tokens unset: max_tokens / 2. all-MiniLM-L6-v2 was trained on pieces of up to 128
# tokens; chunks of half to all of its 256-token window found a known sentence's document
# better than chunks filled to 256 (recall@10 0.934 vs 0.920, MRR@10 0.838 vs 0.775, on
# BENCHMARKS.md section 13's documents), for a third more vectors.
DEFAULT_MIN_DIVISOR = 2

_CHUNKERS: dict[str, Chunker] = {}  # by embedder identity (chunker_for)


def resolve(requested: Chunking | None, window: int) -> Chunking:
    """The chunking a new collection records: `requested` checked against the embedder's
    `window`, unset fields filled in (None: on, at the window)."""
    if requested is None:
        return Chunking(True, window, window // DEFAULT_OVERLAP_DIVISOR, Splitter.TEXT,
                        window // DEFAULT_MIN_DIVISOR)
    if not requested.enabled:
        return Chunking()
    max_tokens = requested.max_tokens or window
    if not 8 <= max_tokens <= window:
        raise InvalidArgument(
            f"chunking.max_tokens must be from 8 to the embedder's window of {window} tokens "
            f"(0 = {window}), got {requested.max_tokens}"
        )
    overlap = requested.overlap_tokens
    if overlap < 0:
        overlap = max_tokens // DEFAULT_OVERLAP_DIVISOR
    if overlap > max_tokens // 2:
        raise InvalidArgument(
            f"chunking.overlap_tokens must be from 0 to max_tokens / 2 = {max_tokens // 2}, "
            f"got {overlap}"
        )
    min_tokens = requested.min_tokens
    if min_tokens <= 0:
        min_tokens = max_tokens // DEFAULT_MIN_DIVISOR
    if not 1 <= min_tokens <= max_tokens:
        raise InvalidArgument(
            f"chunking.min_tokens must be from 1 to max_tokens = {max_tokens}, got {min_tokens}"
        )
    return Chunking(True, max_tokens, overlap, requested.splitter, min_tokens)


def check_window(chunking: Chunking, embedder: Any, collection: str) -> None:
    """Refuse to embed a collection's chunks with an embedder whose window is smaller than
    they are (it would truncate them: what chunking exists to prevent). Re-chunking a
    collection for such an embedder is not built yet."""
    if chunking.enabled and chunking.max_tokens > embedder.max_seq_length:
        raise FailedPrecondition(
            f"collection {collection!r} is chunked at {chunking.max_tokens} tokens, but "
            f"{embedder.identity} reads at most {embedder.max_seq_length}: its chunks would be "
            "truncated. Create a collection with chunking.max_tokens <= "
            f"{embedder.max_seq_length} and upsert the documents into it"
        )


def chunker_for(embedder: Any) -> Chunker:
    """The one Chunker of an embedder (by identity), made on first use: collections and
    memory share it and its splitters."""
    c = _CHUNKERS.get(embedder.identity)
    if c is None:
        c = _CHUNKERS.setdefault(embedder.identity, Chunker(embedder))
    return c


class Chunker:
    """Splits texts for one embedder (its tokenizer and the special tokens it adds)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        # what the model adds to every text ([CLS] and [SEP] for BERT-style models)
        self.special = int(embedder.count_tokens_untruncated([""])[0])

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text, special tokens included, without truncation."""
        return list(self.embedder.count_tokens_untruncated(list(texts)))

    def spans(self, texts: Sequence[str], chunking: Chunking) -> list[list[tuple[int, int]]]:
        """For each text, its chunks as (start, end) offsets in code points: one covering it
        whole when it fits `chunking.max_tokens`."""
        budget = chunking.max_tokens
        # a token covers at least one character, so a text this short always fits
        check = [i for i, t in enumerate(texts) if len(t) > budget - self.special]
        fits = set(range(len(texts))) - set(check)
        if check:
            counts = self.token_counts([texts[i] for i in check])
            fits.update(i for i, n in zip(check, counts, strict=True) if n <= budget)
        out = []
        for i, text in enumerate(texts):
            if i in fits:
                out.append([(0, len(text))])
                continue
            splitter = self._splitter(chunking)
            spans = [(s, s + len(c)) for s, c in splitter.chunk_indices(text)]
            out.append(spans or [(0, len(text))])
        return out

    def truncated(self, texts: Sequence[str], window: int) -> int:
        """How many of `texts` are longer than `window` tokens (embedded truncated)."""
        long = [t for t in texts if len(t) > window - self.special]
        return sum(1 for n in self.token_counts(long) if n > window) if long else 0

    @functools.lru_cache(maxsize=8)  # noqa: B019 - one Chunker per embedder, kept for good
    def _splitter(self, chunking: Chunking) -> Any:
        top = max(1, chunking.max_tokens - self.special)
        low = min(top, max(1, (chunking.min_tokens or chunking.max_tokens) - self.special))
        capacity = (low, top) if low < top else top
        overlap = min(chunking.overlap_tokens, low - 1) if low > 1 else 0
        kind = MarkdownSplitter if chunking.splitter == Splitter.MARKDOWN else TextSplitter
        tokenizer = getattr(self.embedder, "hf_tokenizer", None)
        if tokenizer is not None:
            return kind.from_huggingface_tokenizer(tokenizer, capacity, overlap=overlap)
        special = self.special

        def count(text: str) -> int:
            return int(self.embedder.count_tokens_untruncated([text])[0]) - special

        return kind.from_callback(count, capacity, overlap=overlap)
