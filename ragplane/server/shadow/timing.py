"""G2's estimator: shadow time / canonical time on the same batches, and how sure we are.

Each timed batch runs three embeds of the very same texts, in one of two orders that
alternate batch by batch: canonical, shadow, canonical (A/B/A) or shadow, canonical,
shadow (B/A/B). Per batch, in logs,

    A/B/A:  d = log t2 - (log t1 + log t3) / 2        floor_A = log t3 - log t1
    B/A/B:  d = (log t1 + log t3) / 2 - log t2        floor_B = log t3 - log t1

Why both orders: whatever makes the third run of a batch slower than the first (a sample
is taken right after a request was answered, so the next request tends to land on the
third run; caches; frequency) biases A/B/A alone in the shadow's favour by half that
effect. It enters d with opposite signs in the two orders, so their average is unbiased
for any effect of position that scales with the run's time. What position cannot explain
is one embedder slowing the other (threads left spinning, caches evicted): the shadow
slowing the canonical after it lowers d in both orders, and shows as the canonical's floor
(A/A: the canonical after the shadow against before it) above the shadow's (B/B). The
opposite differences all bias d against the shadow: the canonical slowing the shadow
after it, and a delay of fixed length on the third run (a colliding request), which
weighs more on the faster of the two (measured in the flip demo on 2 cores: short texts
A/A 1.13 against B/B 1.42 with the shadow at 0.67x). So

  * the ratio is exp(mean d);
  * the upper bound is a batch-means bound: the n per-batch d are cut into m consecutive
    blocks of b batches (b = floor(sqrt(n)) rounded up to even, so each block holds both
    orders alike; the oldest n - m*b are left out), and
        upper = exp( mean + t(0.95, m - 1) * sd(block means) / sqrt(m) + max(0, asym) )
    with Student's t for m - 1 degrees of freedom, one-sided 95%, widened by the measured
    asymmetry asym = mean(floor_A) - mean(floor_B) where it favours the shadow (asym > 0);
  * a run proves nothing -- G2 fails whatever the ratio -- unless both orders were timed
    and the one-sided 95% lower bound of asym (Welch's t over the per-batch floors of the
    two orders) is <= log(max_aa_ratio): the runs do not show the shadow slowing the
    canonical after it by more than that. An asymmetry the other way only makes the
    estimate conservative.
With fewer than 2 blocks there is no bound (infinite).

Why a bound and not the point asym: in the service, timed runs share the cores with the
requests being served, and the floors carry that noise. Measured on 2 cores (AMD EPYC,
BENCHMARKS.md section 7): with the embedders alone (`python -m bench.aa_floor`) the floors
lie within 0.94-1.05 for A/A and A/A never exceeds B/B by 5% beyond its noise (lower bounds
0.61-0.96), while under the flip demo's traffic both floors sit at 1.1-1.35 and their point
ratio crossed 1.05 on one class or another in most runs, in either direction, so a point
test held the flip on noise alone. The widening above still adds the point asym.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

# one timed batch: (first, second, third run in seconds, whether the shadow ran first)
Timing = tuple[float, float, float, bool]


@dataclass(frozen=True)
class TimeRatio:
    ratio: float  # exp(mean d); 0.0 without timings
    upper: float  # one-sided 95% upper bound, widened by the asymmetry; inf: too few blocks
    aa: float  # exp(mean floor_A): the canonical after the shadow / before it; 0.0: none
    bb: float  # exp(mean floor_B): the shadow after the canonical / before it; 0.0: none
    batches: int
    blocks: int
    # one-sided 95% lower bound of log(aa / bb) (Welch's t over the per-batch floors of the
    # two orders); nan until each order has two timed batches
    asym_low: float = math.nan

    @property
    def asymmetry_lower(self) -> float:
        """The one-sided 95% lower bound of aa / bb -- above 1, the shadow slows the
        canonical after it more than the reverse (0.0 until each order has two timed
        batches)."""
        return math.exp(self.asym_low) if math.isfinite(self.asym_low) else 0.0


NONE = TimeRatio(0.0, math.inf, 0.0, 0.0, 0, 0)


def _bound(values: np.ndarray) -> tuple[float, float, int]:
    """(mean, batch-means upper 95% bound, blocks) of per-batch log ratios."""
    n = len(values)
    size = max(2, math.isqrt(n))
    size += size % 2
    m = n // size
    if m < 2:
        return float(values.mean()), math.inf, m
    blocks = values[n - m * size :].reshape(m, size).mean(axis=1)
    mean, sd = float(blocks.mean()), float(blocks.std(ddof=1))
    return mean, mean + float(stats.t.ppf(0.95, m - 1)) * sd / math.sqrt(m), m


def estimate(timings: Sequence[Timing]) -> TimeRatio:
    """The G2 ratio of `timings`, oldest first; a batch with a time that is not positive
    is left out (a clock that did not move measured nothing)."""
    rows = [t for t in timings if min(t[:3]) > 0]
    if not rows:
        return NONE
    logs = np.log(np.asarray([t[:3] for t in rows], dtype=np.float64))
    shadow_first = np.asarray([bool(t[3]) for t in rows])
    mid = logs[:, 1] - (logs[:, 0] + logs[:, 2]) / 2
    d = np.where(shadow_first, -mid, mid)
    floor = logs[:, 2] - logs[:, 0]
    fa = float(floor[~shadow_first].mean()) if (~shadow_first).any() else math.nan
    fb = float(floor[shadow_first].mean()) if shadow_first.any() else math.nan
    mean, upper, blocks = _bound(d)
    asym = fa - fb
    asym_low = _asymmetry_low(floor[~shadow_first], floor[shadow_first], asym)
    if math.isfinite(upper) and math.isfinite(asym):
        upper += max(0.0, asym)
    return TimeRatio(
        ratio=math.exp(mean),
        upper=math.exp(upper) if math.isfinite(upper) else math.inf,
        aa=math.exp(fa) if math.isfinite(fa) else 0.0,
        bb=math.exp(fb) if math.isfinite(fb) else 0.0,
        batches=len(rows),
        blocks=blocks,
        asym_low=asym_low,
    )


def _asymmetry_low(fa: np.ndarray, fb: np.ndarray, asym: float) -> float:
    """The one-sided 95% lower bound of mean(fa) - mean(fb) by Welch's t; the point value
    when neither order's floors vary (every batch timed alike); nan with fewer than two
    batches in either order."""
    if len(fa) < 2 or len(fb) < 2:
        return math.nan
    va, vb = float(fa.var(ddof=1)) / len(fa), float(fb.var(ddof=1)) / len(fb)
    if va + vb < 1e-24:  # every batch of each order timed alike
        return asym
    df = (va + vb) ** 2 / (va**2 / (len(fa) - 1) + vb**2 / (len(fb) - 1))
    return asym - float(stats.t.ppf(0.95, df)) * math.sqrt(va + vb)


def run_interleaved(canonical, shadow, texts: list[str], shadow_first: bool, pause_s: float):
    """Three embeds of the same texts, canonical-shadow-canonical or, `shadow_first`,
    shadow-canonical-shadow, each after `pause_s` (the module docstring: why both
    orders). Returns the shadow's vectors, the canonical's, and (t1, t2, t3,
    shadow_first) in seconds."""
    a, b = (shadow, canonical) if shadow_first else (canonical, shadow)
    times, out = [], {}
    for e in (a, b, a):
        if pause_s:
            time.sleep(pause_s)
        t0 = time.perf_counter()
        out[e.identity] = e.embed(texts, normalize=False)
        times.append(time.perf_counter() - t0)
    return out[shadow.identity], out[canonical.identity], (*times, shadow_first)
