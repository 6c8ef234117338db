"""G2's estimator: shadow time / canonical time on the same batches, and how sure we are.

Each timed batch is run three times on the very same texts: canonical (a1), shadow (b),
canonical (a2). Two estimates of log(shadow / canonical) come from it:

  * d_mid    = log b - (log a1 + log a2) / 2   -- unbiased when the clock drifts linearly;
  * d_before = log b - log a1                  -- unbiased when running the shadow slows the
                                                 canonical that follows it (threads left
                                                 spinning, caches evicted).

The A/A floor, log(a2 / a1), cannot tell those two apart: a positive floor may be drift or
interference. So the verdict takes whichever estimate is worse for the shadow, and a run
whose floor lies outside [1 / max_aa_ratio, max_aa_ratio] proves nothing at all.

Consecutive batches are not independent (load, frequency and cache state persist), so the
upper bound is a batch-means bound: the n per-batch estimates are cut into m consecutive
blocks of b = floor(sqrt(n)) batches (the oldest n - m*b are left out), and

    upper = exp( mean + t(0.95, m - 1) * sd(block means) / sqrt(m) )

with Student's t for m - 1 degrees of freedom, one-sided 95%. With fewer than 2 blocks there
is no bound (infinite).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class TimeRatio:
    ratio: float  # exp(mean) of the worse estimate; 0.0 without timings
    upper: float  # one-sided 95% upper bound of the same; inf with too few blocks
    aa: float  # exp(mean log(a2 / a1)): the A/A noise floor; 0.0 without timings
    batches: int
    blocks: int
    estimate: str  # "mid" | "before": which estimate the verdict took

    def aa_within(self, max_aa_ratio: float) -> bool:
        return self.batches > 0 and abs(math.log(self.aa)) <= math.log(max_aa_ratio) + 1e-12


NONE = TimeRatio(0.0, math.inf, 0.0, 0, 0, "mid")


def _upper(values: np.ndarray) -> tuple[float, float, int]:
    """(mean, batch-means upper 95% bound, blocks) of per-batch log ratios, in log space."""
    n = len(values)
    size = max(1, math.isqrt(n))
    m = n // size
    if m < 2:
        return float(values.mean()), math.inf, m
    blocks = values[n - m * size :].reshape(m, size).mean(axis=1)
    mean, sd = float(blocks.mean()), float(blocks.std(ddof=1))
    return mean, mean + float(stats.t.ppf(0.95, m - 1)) * sd / math.sqrt(m), m


def estimate(timings: Sequence[tuple[float, float, float]]) -> TimeRatio:
    """The G2 ratio of `timings` [(a1, b, a2) seconds, oldest first]; rows with a time
    that is not positive are left out (a clock that did not move measured nothing)."""
    rows = np.asarray([t for t in timings if min(t) > 0], dtype=np.float64).reshape(-1, 3)
    if not len(rows):
        return NONE
    la1, lb, la2 = np.log(rows[:, 0]), np.log(rows[:, 1]), np.log(rows[:, 2])
    mid = _upper(lb - (la1 + la2) / 2)
    before = _upper(lb - la1)
    worse, name = (before, "before") if before[1] > mid[1] else (mid, "mid")
    if not math.isfinite(worse[1]):  # no bound yet: report the larger point estimate
        worse, name = (before, "before") if before[0] > mid[0] else (mid, "mid")
    return TimeRatio(
        ratio=math.exp(worse[0]),
        upper=math.exp(worse[1]) if math.isfinite(worse[1]) else math.inf,
        aa=math.exp(float((la2 - la1).mean())),
        batches=len(rows),
        blocks=worse[2],
        estimate=name,
    )
