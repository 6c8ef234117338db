"""Dynamic batching: concurrent requests share forward passes under a token budget.

Callers block in `embed()`; one worker thread drains the queue. A pass takes queued
texts in arrival order until the token budget (padded tokens: texts x longest text) is
reached, sorts them by length so padding is small, runs the embedder, and hands each
caller its rows. A request larger than one pass is split across passes. The queue is
bounded in texts: past it callers get RESOURCE_EXHAUSTED with a retry-after hint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ragplane.core.errors import ResourceExhausted, Unavailable
from ragplane.server.embedding.base import Embedder, l2_normalize

log = logging.getLogger(__name__)


class BadEmbedderOutput(ValueError):
    """An embedder returned vectors of the wrong shape for its pass: every caller of the
    pass hears it (rather than the pass's thread dying with callers left waiting)."""


@dataclass
class _Request:
    texts: Sequence[str]
    tokens: Sequence[int]
    out: np.ndarray
    future: Future[np.ndarray]
    is_active: Callable[[], bool]
    remaining: int
    failed: bool = False


@dataclass
class _Slice:
    req: _Request
    start: int
    stop: int
    tokens: int = field(default=0)


@dataclass
class BatchStats:
    passes: int = 0
    texts: int = 0
    requests: int = 0
    last_pass_texts: int = 0
    last_pass_requests: int = 0


class EmbedBatcher:
    def __init__(
        self,
        embedder: Embedder,
        *,
        max_tokens: int = 16384,
        max_wait_s: float = 0.002,
        max_queue_texts: int = 65536,
        on_pass: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.embedder = embedder
        self.max_tokens = max_tokens
        self.max_wait_s = max_wait_s
        self.max_queue_texts = max_queue_texts
        self.stats = BatchStats()
        self._on_pass = on_pass  # (texts, requests, seconds) -> None, for metrics
        self._queue: deque[_Slice] = deque()
        self._queued_texts = 0
        self._cond = threading.Condition()
        self._closed = False
        self._ema_texts_per_s = 200.0
        self._thread = threading.Thread(target=self._run, name="embed-batcher", daemon=True)
        self._thread.start()

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    def embed(
        self,
        texts: Sequence[str],
        tokens: Sequence[int],
        *,
        normalize: bool = True,
        is_active: Callable[[], bool] = lambda: True,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Embed `texts` (with their truncated token counts) -> float32 [n, dim]."""
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        future: Future[np.ndarray] = Future()
        req = _Request(
            texts=texts,
            tokens=tokens,
            out=np.empty((n, self.embedder.dim), dtype=np.float32),
            future=future,
            is_active=is_active,
            remaining=n,
        )
        with self._cond:
            if self._closed:
                raise Unavailable("the server is shutting down; retry on another instance")
            if self._queued_texts and self._queued_texts + n > self.max_queue_texts:
                wait = (self._queued_texts + n) / max(self._ema_texts_per_s, 1.0)
                raise ResourceExhausted(
                    f"the embedding queue is full ({self._queued_texts} texts waiting); "
                    f"retry after {wait:.1f}s or send smaller batches",
                    retry_after=wait,
                )
            self._enqueue(req)
            self._cond.notify()
        vectors = future.result(timeout=timeout)
        return l2_normalize(vectors) if normalize else vectors

    def _enqueue(self, req: _Request) -> None:
        # Split into slices that each fit a pass on their own.
        start, acc, longest = 0, 0, 0
        for i, t in enumerate(req.tokens):
            longest_next = max(longest, t)
            if i > start and longest_next * (i - start + 1) > self.max_tokens:
                self._queue.append(_Slice(req, start, i, acc))
                start, acc, longest_next = i, 0, t
            longest = longest_next
            acc += t
        self._queue.append(_Slice(req, start, len(req.texts), acc))
        self._queued_texts += len(req.texts)

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _take_pass(self) -> list[_Slice]:
        """Under the lock: slices for one pass, FIFO, within the padded-token budget."""
        taken: list[_Slice] = []
        count, longest = 0, 0
        while self._queue:
            s = self._queue[0]
            n = s.stop - s.start
            s_longest = max(s.req.tokens[s.start : s.stop])
            if taken and max(longest, s_longest) * (count + n) > self.max_tokens:
                break
            self._queue.popleft()
            self._queued_texts -= n
            if s.req.failed or (s.start == 0 and not s.req.is_active()):
                self._fail(s.req, TimeoutError("the call ended before its texts were embedded"))
                continue
            taken.append(s)
            count += n
            longest = max(longest, s_longest)
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
            # Give concurrent callers a moment to join this pass.
            if self.max_wait_s:
                deadline = time.monotonic() + self.max_wait_s
                with self._cond:
                    while time.monotonic() < deadline and self._padded_queued() < self.max_tokens:
                        self._cond.wait(deadline - time.monotonic())
            with self._cond:
                taken = self._take_pass()
            if taken:
                self._run_pass(taken)

    def _padded_queued(self) -> int:
        longest = max((max(s.req.tokens[s.start : s.stop]) for s in self._queue), default=0)
        return longest * self._queued_texts

    def _run_pass(self, taken: list[_Slice]) -> None:
        texts: list[str] = []
        for s in taken:
            texts.extend(s.req.texts[s.start : s.stop])
        t0 = time.perf_counter()
        try:
            vectors = self.embedder.embed(texts, normalize=False)
        except Exception as exc:  # the embedder failed: every caller of this pass hears it
            log.exception("embedding pass of %d texts failed", len(texts))
            for s in taken:
                self._fail(s.req, exc)
            return
        shape = getattr(vectors, "shape", None)
        if shape != (len(texts), self.embedder.dim):
            bad = BadEmbedderOutput(f"shape {shape}, expected ({len(texts)}, {self.embedder.dim})")
            log.error("%s returned %s", self.embedder.identity, bad)
            for s in taken:
                self._fail(s.req, bad)
            return
        dt = time.perf_counter() - t0
        self._ema_texts_per_s = 0.8 * self._ema_texts_per_s + 0.2 * (len(texts) / max(dt, 1e-6))
        row = 0
        requests = {id(s.req) for s in taken}
        for s in taken:
            n = s.stop - s.start
            s.req.out[s.start : s.stop] = vectors[row : row + n]
            row += n
            s.req.remaining -= n
            if s.req.remaining == 0 and not s.req.failed:
                s.req.future.set_result(s.req.out)
        self.stats.passes += 1
        self.stats.texts += len(texts)
        self.stats.requests += len(requests)
        self.stats.last_pass_texts = len(texts)
        self.stats.last_pass_requests = len(requests)
        if self._on_pass:
            self._on_pass(len(texts), len(requests), dt)

    @staticmethod
    def _fail(req: _Request, exc: BaseException) -> None:
        if not req.failed:
            req.failed = True
            if not req.future.done():
                req.future.set_exception(exc)
