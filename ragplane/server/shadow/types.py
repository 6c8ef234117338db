"""What the shadow experiments report: evidence per shadow release, gates, flip history."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GateResult:
    name: str  # "G1 agreement" | "G2 performance" | "G3 stability"
    passed: bool
    value: str  # the measured numbers, for people
    missing: str = ""  # what is still needed to pass


@dataclass(frozen=True)
class ClassEvidence:
    """The evidence of one traffic class (server.shadow.classes) of one release."""

    name: str  # short | medium | window
    # offered batches of this class: sampled (compared or failed) + skipped while the
    # server was busy + dropped (the queue was full)
    batches: int = 0
    share: float = 0.0  # of all offered batches of the release
    samples: int = 0  # vectors compared
    cosine_min: float = 0.0
    cosine_mean: float = 0.0
    time_ratio: float = 0.0
    time_ratio_upper: float = 0.0
    aa_time_ratio: float = 0.0  # the canonical after the shadow / before it (A/B/A batches)
    bb_time_ratio: float = 0.0  # the shadow after the canonical / before it (B/A/B batches)
    timed_batches: int = 0
    errors: int = 0
    dropped: int = 0
    carried: bool = False  # share >= the gates' min_class_share: must hold G1 and G2
    passed_g1: bool = False
    passed_g2: bool = False
    sampled: int = 0  # compared or failed
    skipped_busy: int = 0  # not sampled: requests were waiting (counted, never silent)
    busy_sampled: int = 0  # of `sampled`, those taken while requests were waiting
    # the one-sided 95% lower bound of aa_time_ratio / bb_time_ratio (server.shadow.timing);
    # 0.0: fewer than two timed batches in an order (the point ratio is judged instead)
    aa_bb_lower: float = 0.0


@dataclass(frozen=True)
class ReleaseEvidence:
    """Evidence for one shadow release (name@version) of one case-of-use, measured against
    one canonical on one hardware class. The numbers at the top pool every class; the
    gates judge `classes`."""

    shadow: str
    samples: int = 0  # vectors compared
    cosine_min: float = 0.0
    cosine_p1: float = 0.0
    cosine_mean: float = 0.0
    overlap_at_10: float = 0.0  # probe queries, each embedder searching its own vectors
    probes: int = 0
    time_ratio: float = 0.0  # shadow time / canonical time on the same batches
    time_ratio_upper: float = 0.0  # upper 95% confidence bound of that ratio
    aa_time_ratio: float = 0.0  # canonical / canonical on the same batches: the noise floor
    timed_batches: int = 0
    errors: int = 0
    dropped: int = 0
    passed_g1: bool = False
    passed_g2: bool = False
    bb_time_ratio: float = 0.0  # shadow / shadow: its floor, beside aa_time_ratio's
    canonical: str = ""  # name@version it was compared against
    hardware: str = ""  # e.g. "cpu x86_64 avx512", "gpu NVIDIA H200" (server.shadow.hardware)
    phase: str = "shadow"  # shadow: before a flip | watch: while the shadow served
    # observed shadow time: the sum of the gaps between consecutive sampled batches, each
    # at most evidence.ACTIVE_GAP_S (a quiet day adds nothing)
    seconds: float = 0.0
    batches: int = 0  # offered batches, every class (see ClassEvidence.batches)
    last_error: str = ""  # what the latest shadow error was
    classes: tuple[ClassEvidence, ...] = ()
    sampled: int = 0  # compared or failed, every class
    compared: int = 0  # compared batches: what G3's batch minimum counts (never drops)
    skipped_busy: int = 0
    busy_sampled: int = 0


@dataclass(frozen=True)
class FlipEvent:
    at: float
    action: str  # flip | unflip
    serving: str
    forced: bool = False
    reason: str = ""


@dataclass(frozen=True)
class CaseStatus:
    use_case: str
    status: str  # experimental | shadow-active | flipped | unavailable (see reason)
    policy: str  # manual | auto
    sample_rate: float
    canonical: str  # name@version of the declared canonical embedder
    shadow: str  # name@version of the declared shadow embedder
    serving: str  # name@version answering now
    gates: tuple[GateResult, ...] = ()
    flip_eligible: bool = False
    releases: tuple[ReleaseEvidence, ...] = ()
    history: tuple[FlipEvent, ...] = field(default_factory=tuple)
    reason: str = ""  # why the declared shadow does not run (status unavailable)
    hardware: str = ""  # the hardware class of this decision
    kernel: str = ""  # the kernel the shadow (embedder_rs) chose, e.g. avx512, avx2, wgpu
    # the watch of the current release (its evidence while it served, every flip of it):
    # the same gates, which unflip the case by themselves when one fails
    watch: tuple[GateResult, ...] = ()
    # why the current release may not flip again (its watch failed), "" when it may
    barred: str = ""
    watch_releases: tuple[ReleaseEvidence, ...] = ()  # every release's watch record
