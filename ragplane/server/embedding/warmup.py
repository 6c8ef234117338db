"""Warm-up at load: each embedder runs the largest pass the batcher can form before the
server answers, so its allocator reaches its peak at start and not at some later minute.

ONNX Runtime's CPU arena grows to the most memory its runs have needed at once and keeps
it. Measured with all-MiniLM-L6-v2 on 2 cores: 201 MB loaded, 426 MB after one 16 x 256
run, 580 MB after two such runs at once (the batcher's pass and the shadow's A/B/A timing
share one session). Under load the second happened minutes in, as a 130 MB step in RSS
(BENCHMARKS.md section 9). Text Embeddings Inference warms its model up at max batch
tokens at start for the same reason.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from ragplane.core.errors import FailedPrecondition
from ragplane.server.embedding.base import Embedder

log = logging.getLogger(__name__)

WORD = "warm"  # one token in a WordPiece vocabulary; the count is checked, not assumed


def largest_pass(max_tokens: int, max_seq_length: int) -> int:
    """Texts in the largest pass the batcher forms: texts of `max_seq_length` tokens, as
    many as the padded-token budget `max_tokens` holds (at least one)."""
    return max(1, max_tokens // max_seq_length)


def _longest_text(embedder: Embedder) -> str:
    """A text that is exactly `max_seq_length` tokens after truncation."""
    text = " ".join([WORD] * embedder.max_seq_length)
    (n,) = embedder.count_tokens([text])
    if n != embedder.max_seq_length:
        raise FailedPrecondition(
            f"{embedder.identity}: a warm-up text of {embedder.max_seq_length} words counts "
            f"{n} tokens, not max_seq_length {embedder.max_seq_length}"
        )
    return text


def warm_up(embedder: Embedder, *, texts: int, parallel: int = 1) -> float:
    """Embed `texts` texts of `max_seq_length` tokens on `parallel` threads at once (how
    many passes may run on this embedder at the same time); seconds taken.

    An embedder that cuts a call into runs of at most `largest_run` texts (an optional
    attribute: ONNX Runtime's sub-batches) is warmed up with one such run per thread: its
    largest shape for a quarter of the work (on 2 busy cores: two 16 x 256 runs at once
    took 3.1 s, where one whole 64-text pass alone took 4.0 s).

    Raises FailedPrecondition naming the embedder and the shape when it cannot: a server
    that cannot run its largest pass at start would fail on the first large request."""
    texts = min(texts, getattr(embedder, "largest_run", texts))
    batch = [_longest_text(embedder)] * texts
    t0 = time.perf_counter()
    try:
        if parallel > 1:
            # alone first: ONNX Runtime plans a shape's memory on its first run and from then
            # on takes it as one block per run; first runs at once peaked ~100 MB lower
            # than planned ones at once did later (468 vs 567 MB)
            embedder.embed(batch, False)
        with ThreadPoolExecutor(parallel, thread_name_prefix="warm-up") as pool:
            for f in [pool.submit(embedder.embed, batch, False) for _ in range(parallel)]:
                f.result()
    except Exception as exc:
        raise FailedPrecondition(
            f"{embedder.identity} failed its warm-up at the largest pass the batcher can form "
            f"({texts} texts x {embedder.max_seq_length} tokens, {parallel} at once): {exc}. "
            "Lower batch_max_tokens, or give the server more memory"
        ) from exc
    seconds = time.perf_counter() - t0
    log.info(
        "warmed up %s: %d texts x %d tokens, %d at once, in %.1f s",
        embedder.identity,
        texts,
        embedder.max_seq_length,
        parallel,
        seconds,
    )
    return seconds
