"""The flip's evidence over time, for the console's charts. Read-only, and only through
public faces: the evidence store's `stored()` (what ShadowStatus's gates are computed
from) and the manager's `status()` (the ShadowStatus RPC's own function).

Two kinds of series:
  * `ratio_series`: G2's time ratio, its upper 95% bound and the A/A and B/B floors per
    traffic class, as `timing.estimate` (G2's own estimator) gives them on the first n
    timed batches the store keeps, for n up to all of them (the last point is the gate's
    verdict): how the estimate and its bound converged as evidence came in. Its x is the
    timed batch (the store keeps each timing's order; `stored()` does not hand out when
    each was taken).
  * `Sampler`: snapshots of what `status()` says (cosine min / mean, the pooled ratio
    and floor, batches sampled, dropped, failed, and any other count a class reports) on
    a timer, in memory, since this server started: the x is wall-clock time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import deque
from typing import Any

from ragplane.server.shadow.evidence import EvidenceStore
from ragplane.server.shadow.timing import TimeRatio, Timing, estimate
from ragplane.server.shadow.types import CaseStatus, ClassEvidence, ReleaseEvidence

log = logging.getLogger(__name__)
POINTS = 40  # per series: enough to see a trend, few enough to draw at once
KEEP = 720  # snapshots per case (an hour at 5 s)
# counts a class reports, charted as "batches": sampled, dropped, failed, and whichever
# others the shadow adds (busy-skipped ...), found by their type and name
_COUNT_HINTS = ("batches", "dropped", "errors", "skipped", "busy", "sampled", "compared")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) and x > 0 else None


def ratio_series(
    store: EvidenceStore, case: CaseStatus, phase: str = "shadow", points: int = POINTS
) -> dict[str, dict[str, list[Any]]]:
    """Per class: {"n": timed batches, "ratio", "upper", "aa", "bb": values at n} of the
    release `case` is deciding on (its shadow, canonical and hardware class)."""
    mine = (case.shadow, case.canonical, case.hardware)
    out: dict[str, dict[str, list[Any]]] = {}
    for s in store.stored(case.use_case, phase):
        if (s.key.release, s.key.canonical, s.key.hardware) != mine:
            continue
        for cls, row in s.classes.items():
            rows = row.timings
            if not rows:
                continue
            ns = grid(len(rows), points)
            series: dict[str, list[Any]] = {"n": [], "ratio": [], "upper": [], "aa": [],
                                            "bb": []}
            for n in ns:
                t = _estimate(rows, n)
                series["n"].append(n)
                series["ratio"].append(_finite(t.ratio))
                series["upper"].append(_finite(t.upper))
                series["aa"].append(_finite(t.aa))
                series["bb"].append(_finite(t.bb))
            out[cls] = series
    return out


def grid(n: int, points: int) -> list[int]:
    """Prefix lengths 1..n spaced geometrically (the charts' x axis is logarithmic): a
    bound narrows like 1/sqrt(n), and the points cost about 5n timings to estimate, not
    points * n / 2 as an even spacing would (at the store's 10,000 timings per class)."""
    if n <= points:
        return list(range(1, n + 1))
    ratio = n ** (1 / (points - 1))
    return sorted({min(n, max(1, round(ratio**k))) for k in range(points)} | {n})


_cache: dict[tuple, TimeRatio] = {}


def _estimate(rows: list[Timing], n: int) -> TimeRatio:
    """`estimate(rows[:n])`, remembered: timings only ever append (the oldest are trimmed
    past MAX_TIMINGS, which the first row in the key notices), so a page drawn again
    computes only the points that are new."""
    key = (n, rows[0], rows[n - 1])
    if (t := _cache.get(key)) is None:
        if len(_cache) > 20_000:
            _cache.clear()
        t = _cache[key] = estimate(rows[:n])
    return t


def counts_of(ev: ReleaseEvidence | ClassEvidence) -> dict[str, int]:
    """Every count-like integer field of a release's or a class's evidence, by name."""
    return {
        f.name: getattr(ev, f.name)
        for f in dataclasses.fields(ev)
        if isinstance(getattr(ev, f.name), int) and not isinstance(getattr(ev, f.name), bool)
        and any(h in f.name for h in _COUNT_HINTS)
    }


def current(case: CaseStatus) -> ReleaseEvidence | None:
    """The release `case` decides on, among those its status reports."""
    mine = (case.shadow, case.canonical, case.hardware)
    return next((r for r in case.releases if (r.shadow, r.canonical, r.hardware) == mine), None)


def snapshot(case: CaseStatus, at: float) -> dict[str, Any]:
    ev = current(case)
    if ev is None:
        return {"t": at}
    return {
        "t": at,
        "cosine_min": ev.cosine_min if ev.samples else None,
        "cosine_mean": ev.cosine_mean if ev.samples else None,
        "ratio": _finite(ev.time_ratio),
        "upper": _finite(ev.time_ratio_upper),
        "aa": _finite(ev.aa_time_ratio),
        **counts_of(ev),
    }


class Sampler:
    """Snapshots of every case's status every `every` seconds on a daemon thread, and on
    demand (`sample`, at most once a second), kept in memory per case."""

    def __init__(self, status: Any, every: float = 5.0) -> None:
        self._status = status  # () -> list[CaseStatus]: the ShadowStatus RPC's function
        self._every = every
        self._lock = threading.Lock()
        self._series: dict[str, deque[dict[str, Any]]] = {}
        self._last = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.sample()
            except Exception:  # a store away for a moment: the next round tries again
                log.warning("the console's shadow sampler failed", exc_info=True)

    def sample(self, cases: list[CaseStatus] | None = None) -> None:
        now = time.time()
        with self._lock:
            if now - self._last < 1.0:
                return
            self._last = now
        for case in cases if cases is not None else self._status():
            if case.status == "unavailable":
                continue
            with self._lock:
                self._series.setdefault(case.use_case, deque(maxlen=KEEP)).append(
                    snapshot(case, now)
                )

    def series(self, use_case: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._series.get(use_case, ()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
