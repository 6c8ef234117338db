"""Rebuild progress reports, and the emitter a rebuild feeds them through."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Phase = Literal["embedding", "indexing", "checking", "swapped", "refused"]


@dataclass(frozen=True)
class RebuildProgress:
    """One progress report of a rebuild.

    `done` / `total` count items of the current phase; `rate` is items per second over the
    phase so far and `eta_seconds` the time left at that rate (0 when unknown or finished).
    `recall` is set from the "checking" phase on (recall@10 against exact search).
    """

    phase: Phase
    done: int
    total: int
    rate: float = 0.0
    eta_seconds: float = 0.0
    generation: int = 0
    recall: float | None = None
    message: str = ""



class ProgressEmitter:
    """Turns (phase, done) into RebuildProgress reports with rate and ETA for `cb`."""

    def __init__(self, cb: Callable[[RebuildProgress], None] | None, generation: int) -> None:
        self.cb = cb
        self.generation = generation
        self.phase = "indexing"
        self.total = 0
        self.t0 = time.monotonic()
        self.recall: float | None = None

    def start(self, phase: str, total: int) -> None:
        self.phase, self.total, self.t0 = phase, total, time.monotonic()
        self.emit(0)

    def emit(self, done: int, message: str = "", phase: str | None = None) -> None:
        if self.cb is None:
            return
        elapsed = time.monotonic() - self.t0
        rate = done / elapsed if elapsed > 0 and done else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        self.cb(
            RebuildProgress(
                phase=phase or self.phase,  # type: ignore[arg-type]
                done=done,
                total=self.total,
                rate=rate,
                eta_seconds=max(0.0, eta),
                generation=self.generation,
                recall=self.recall,
                message=message,
            )
        )
