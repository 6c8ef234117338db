"""Gate logic on synthetic evidence: G1 and G2 per traffic class, G2's estimator against
its A/A floor, G3 over recorded releases of the same canonical and hardware class
(tests/unit/shadow/test_releases.py covers the history file itself)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.server.shadow.config import Gates, parse_pair
from ragplane.server.shadow.evidence import EvidenceKey, EvidenceStore
from ragplane.server.shadow.gates import evaluate_gates, release_evidence, watch_verdict
from ragplane.server.shadow.timing import estimate

G = Gates(
    min_samples=100,
    min_probes=20,
    min_timed_batches=10,
    min_release_hours=0,
    min_release_batches=0,
)
HW = "cpu x86_64 avx512"
KEY = EvidenceKey("embeddings", "rs@1", "onnx@1", HW)


@pytest.fixture
def store(tmp_path):
    s = EvidenceStore(tmp_path / "shadow.db")
    yield s
    s.close()


def feed(
    store: EvidenceStore,
    key: EvidenceKey = KEY,
    *,
    cls: str = "short",
    batches: int = 15,
    cos: float = 0.999999,
    ratio: float = 1.0,
    aa: float = 1.0,
    timed: int = 40,
    noise: float = 0.01,
    errors: int = 0,
) -> None:
    """`batches` compared batches of 10 vectors at `cos`, and `timed` timed batches, A/B/A
    and B/A/B in turn, whose shadow takes `ratio` x the canonical's time and whose canonical
    takes `aa` x its time when it runs right after the shadow."""
    rng = np.random.default_rng(abs(hash((key, cls))) % 2**32)
    for _ in range(batches):
        store.record_agreement(key, cls, [cos] * 10)
    for i in range(timed):
        x1, x2, x3 = 0.1 * (1 + noise * rng.standard_normal(3))
        if i % 2 == 0:  # canonical, shadow, canonical (slowed after the shadow)
            store.record_timing(key, cls, x1, x2 * ratio, x3 * aa, False)
        else:  # shadow, canonical (slowed after the shadow), shadow
            store.record_timing(key, cls, x1 * ratio, x2 * aa, x3 * ratio, True)
    for _ in range(errors):
        store.record_error(key, cls, "ShadowOutputError: NaN or infinite values in 1 of 8")
    store.record_overlap(key, 1.0, 50)


def evidence(store: EvidenceStore, key: EvidenceKey = KEY, g: Gates = G):
    (s,) = [s for s in store.stored(key.use_case, key.phase) if s.key == key]
    return release_evidence(s, g)


def gates_of(store, key=KEY, g=G, recorded=()):
    return evaluate_gates(evidence(store, key, g), g, recorded, HW)


def test_g1_needs_samples_min_mean_and_overlap(store):
    store.record_agreement(KEY, "short", [0.999999] * 50)
    (g1, _, _), ok = gates_of(store)
    assert not g1.passed and "50 more compared vectors" in g1.missing and not ok
    store.record_agreement(KEY, "short", [0.999999] * 60 + [0.9998])
    store.record_overlap(KEY, 1.0, 50)
    (g1, _, _), _ = gates_of(store)
    assert not g1.passed and "short: min cosine" in g1.missing
    rel = evidence(store)
    assert rel.samples == 111 and rel.cosine_min == pytest.approx(0.9998)
    assert rel.cosine_p1 == pytest.approx(0.999999)  # 1% of 111 -> the 2nd smallest


def test_p1_is_the_first_percentile(store):
    values = np.linspace(0.99, 1.0, 1000)
    store.record_agreement(KEY, "short", values[:500].tolist())
    store.record_agreement(KEY, "medium", values[500:].tolist())
    rel = evidence(store)
    assert rel.cosine_p1 == pytest.approx(np.sort(values)[9])
    assert rel.cosine_mean == pytest.approx(values.mean())


def test_a_shadow_error_fails_g1_and_names_it(store):
    feed(store, errors=1)
    (g1, _, _), ok = gates_of(store)
    assert not g1.passed and not ok
    assert "no shadow errors (1; last: ShadowOutputError: NaN" in g1.missing
    assert evidence(store).batches == 16  # the failed batch is a sampled batch too


def test_non_finite_cosines_never_reach_the_store(store):
    with pytest.raises(ValueError, match="record an error"):
        store.record_agreement(KEY, "short", [0.99, float("nan")])


def test_g2_upper_bound_and_aa_floor(store):
    fast, slow = replace(KEY, release="fast@1"), replace(KEY, release="slow@1")
    feed(store, fast, ratio=0.8)
    feed(store, slow, ratio=1.2)
    f = evidence(store, fast)
    assert f.passed_g2 and f.time_ratio == pytest.approx(0.8, rel=0.02)
    assert f.time_ratio_upper >= f.time_ratio and f.aa_time_ratio == pytest.approx(1.0, rel=0.01)
    assert f.bb_time_ratio == pytest.approx(1.0, rel=0.01)
    assert not evidence(store, slow).passed_g2
    (_, g2, _), _ = gates_of(store, slow)
    assert "short: upper bound" in g2.missing and "faster" in g2.missing


def test_g2_needs_enough_batches(store):
    store.record_timing(KEY, "short", 0.1, 0.05, 0.1, False)
    store.record_agreement(KEY, "short", [1.0])
    (_, g2, _), _ = gates_of(store)
    assert not g2.passed and "short: 9 more timed batches" in g2.missing


def test_a_canonical_slowed_by_the_shadow_no_longer_hides_a_slow_shadow(store):
    """The shadow honestly takes 1.04x the canonical's time, but running it slows the
    canonical right after it by 10% (A/A 1.10). Dividing by the mean of the two canonical
    runs of A/B/A made that 0.99 and passed. Now the canonical's floor (1.10) against the
    shadow's (1.00) shows the interference: the run proves nothing, and even a laxer
    floor would leave a bound that holds the honest 1.04."""
    feed(store, ratio=1.04, aa=1.10, timed=60, noise=0.002)
    ev = evidence(store)
    old = math.exp(np.log(1.04) - np.log(1.10) / 2)  # what the former estimator reported
    assert old < 1.0
    assert ev.aa_time_ratio == pytest.approx(1.10, rel=0.005)
    assert ev.bb_time_ratio == pytest.approx(1.0, rel=0.005)
    (_, g2, _), ok = gates_of(store)
    assert not g2.passed and not ok and "prove nothing" in g2.missing
    lax = evidence(store, g=replace(G, max_aa_ratio=1.2)).classes[0]
    assert lax.time_ratio_upper > 1.05 and not lax.passed_g2  # widened by the asymmetry


def test_noisy_floors_alike_in_both_orders_do_not_hold_a_fast_shadow(store):
    """Under traffic, requests collide with the timed runs: both floors sit well above 1
    and wander (the flip demo on 2 cores: 1.1-1.35). With no interference at all, the
    point A/A / B/B crosses 1.05 by chance; only a ratio shown at 95% holds the run, so a
    shadow at 0.7x still passes, and its floors' lower bound is reported."""
    rng = np.random.default_rng(11)  # a seed whose point ratio is 1.084
    for i in range(60):
        third = float(np.exp(rng.normal(0.15, 0.25)))  # collisions, either order alike
        if i % 2 == 0:
            store.record_timing(KEY, "short", 0.1, 0.07, 0.1 * third, False)
        else:
            store.record_timing(KEY, "short", 0.07, 0.1, 0.07 * third, True)
    store.record_agreement(KEY, "short", [1.0] * 200)
    t = evidence(store).classes[0]
    assert t.aa_time_ratio / t.bb_time_ratio > 1.05  # the point test would hold it
    assert 0 < t.aa_bb_lower < 1.05  # not shown at 95%
    assert t.passed_g2 and t.time_ratio_upper < 1.05
    (_, g2, _), _ = gates_of(store)
    assert g2.passed and "at least" in g2.value


def test_the_order_of_the_runs_does_not_bias_the_ratio(store):
    """Whatever slows the third run of every batch (the next request landing on it) biased
    A/B/A alone in the shadow's favour; with B/A/B in turn it cancels, and the floors,
    equal on both sides, let the run count."""
    for i in range(60):
        third = 1.15  # the third run of every batch, whichever embedder it is
        if i % 2 == 0:
            store.record_timing(KEY, "short", 0.1, 0.1 * 1.04, 0.1 * third, False)
        else:
            store.record_timing(KEY, "short", 0.1 * 1.04, 0.1, 0.1 * 1.04 * third, True)
    store.record_agreement(KEY, "short", [1.0] * 200)
    t = evidence(store).classes[0]
    assert t.time_ratio == pytest.approx(1.04, rel=1e-6)  # A/B/A alone said 0.97
    assert t.aa_time_ratio == pytest.approx(1.15) and t.bb_time_ratio == pytest.approx(1.15)
    (_, g2, _), _ = gates_of(store)
    assert g2.passed  # 1.04 <= 1.05 with no noise at all


def test_a_fixed_delay_on_the_third_run_only_makes_the_estimate_conservative(store):
    """A colliding request adds the same seconds to the third run whichever embedder it
    is: that weighs more on the faster shadow (B/B above A/A), which is no interference
    and biases the ratio against the shadow, so the run counts."""
    a, b, delay = 0.010, 0.006, 0.003
    for i in range(60):
        if i % 2 == 0:
            store.record_timing(KEY, "short", a, b, a + delay, False)
        else:
            store.record_timing(KEY, "short", b, a, b + delay, True)
    store.record_agreement(KEY, "short", [1.0] * 200)
    t = evidence(store).classes[0]
    assert t.bb_time_ratio > t.aa_time_ratio * 1.1  # far apart, the other way round
    assert t.time_ratio > b / a  # conservative: the shadow looks slower than it is
    assert t.passed_g2


def test_the_bound_respects_autocorrelation():
    """Batches in long runs of slow and fast (load that persists) are not independent:
    the batch-means bound is wider than the independent-batches bound on the same data."""
    rng = np.random.default_rng(7)
    x, logs = 0.0, []
    for _ in range(400):
        x = 0.95 * x + 0.02 * rng.standard_normal()
        logs.append(x)
    logs = np.array(logs)
    t = estimate([timed_batch(v, i) for i, v in enumerate(logs)])
    naive = logs.mean() + 1.6449 * logs.std(ddof=1) / math.sqrt(len(logs))
    assert t.blocks == 20
    assert math.log(t.upper / t.ratio) > 3 * (naive - logs.mean())  # three times as wide
    assert estimate([timed_batch(0.1, 0), timed_batch(0.1, 1)]).upper == math.inf  # 1 block


def test_a_class_with_a_real_share_must_hold_on_its_own(store):
    """Pooled, the shadow is fast (most batches are short); window-length batches, a
    fifth of the traffic, take 1.3x: the flip is refused, naming the class."""
    feed(store, cls="short", batches=80, ratio=0.8, timed=80)
    feed(store, cls="window", batches=20, ratio=1.3, timed=20)
    ev = evidence(store)
    assert ev.time_ratio_upper < 1.05  # the pooled bound would have passed
    (g1, g2, _), ok = gates_of(store)
    assert g1.passed and not g2.passed and not ok
    assert "window: upper bound" in g2.missing and "short" not in g2.missing
    # a class under min_class_share is shown, not judged
    rare = replace(G, min_class_share=0.25)
    (_, g2, _), _ = gates_of(store, g=rare)
    assert g2.passed and "window (> 128 tokens, up to the window, 20% of batches): not judged" in (
        g2.value
    )


def test_g3_counts_only_releases_of_the_same_canonical_and_hardware_over_the_minimums(store):
    releases = {}
    for name, key in {
        "same": replace(KEY, release="rs@0.1"),
        "other canonical": replace(KEY, release="rs@0.2", canonical="torch@2"),
        "other hardware": replace(KEY, release="rs@0.3", hardware="cpu x86_64 avx2"),
        "slow": replace(KEY, release="rs@0.4"),
    }.items():
        feed(store, key, ratio=1.3 if name == "slow" else 0.9)
        releases[name] = evidence(store, key)
    feed(store, replace(KEY, release="rs@0.5"))
    live = replace(KEY, release="rs@0.5")
    three = replace(G, min_releases=3)
    gates, ok = gates_of(store, live, three, list(releases.values()))
    g3 = gates[2]
    assert not ok and not g3.passed and "2 of 3" in g3.value
    assert "(rs@0.1 recorded, rs@0.5 live)" in g3.value
    assert "rs@0.2: measured against torch@2, not onnx@1" in g3.value
    assert "rs@0.3: measured on cpu x86_64 avx2, not cpu x86_64 avx512" in g3.value
    assert "rs@0.4: fails G1, G2" in g3.value
    assert "rs@0.1" not in g3.value.split("not counted")[1]
    # with minimum shadow time and batches, rs@0.1 counts only when it meets them
    long_enough = replace(releases["same"], seconds=3 * 3600)
    strict = replace(G, min_releases=2, min_release_hours=2)
    gates, ok = evaluate_gates(
        replace(evidence(store, live, strict), seconds=4 * 3600), strict, [long_enough], HW
    )
    assert gates[2].passed and "rs@0.1 recorded, rs@0.5 live" in gates[2].value
    short = replace(releases["same"], seconds=3600)
    gates, _ = evaluate_gates(evidence(store, live, strict), strict, [short], HW)
    assert "1.0 h of observed shadow time < 2 h" in gates[2].value and not gates[2].passed
    few = replace(G, min_releases=2, min_release_batches=10_000)
    gates, _ = evaluate_gates(evidence(store, live, few), few, [releases["same"]], HW)
    assert "15 compared batches < 10000" in gates[2].value and not gates[2].passed


def test_watch_unflips_on_errors_agreement_or_a_class_that_got_slow(store):
    watch = replace(KEY, phase="watch")
    feed(store, watch, ratio=0.9, timed=5)  # too few timings to judge yet
    _, why = watch_verdict(evidence(store, watch), G)
    assert why == ""
    feed(store, watch, cls="window", batches=10, ratio=1.4, timed=30)
    _, why = watch_verdict(evidence(store, watch), G)
    assert "window: time ratio upper bound" in why and "> 1.05" in why
    other = replace(watch, release="rs@2")  # a release whose watch saw an error
    feed(store, other, errors=1, timed=0)
    gates, why = watch_verdict(evidence(store, other), G)
    assert "1 shadow error(s)" in why and not gates[0].passed


def test_evidence_persists_per_phase(tmp_path):
    s = EvidenceStore(tmp_path / "e.db")
    feed(s)
    feed(s, replace(KEY, phase="watch"), batches=3)
    s.set_serving("embeddings", "rs@1", "flip", True, "test")
    s.close()
    s = EvidenceStore(tmp_path / "e.db")
    assert evidence(s).samples == 150
    assert evidence(s, replace(KEY, phase="watch")).samples == 30
    assert s.serving("embeddings") == "rs@1" and s.history("embeddings")[0].forced
    s.close()


@pytest.mark.parametrize(
    "spec,msg",
    [
        ({"canonical": "a"}, "shadow"),
        ({"canonical": "a", "shadow": "b", "status": "on"}, "status"),
        ({"canonical": "a", "shadow": "b", "policy": "yolo"}, "policy"),
        ({"canonical": "a", "shadow": "b", "sample_rate": 2}, "sample_rate"),
        ({"canonical": "a", "shadow": "b", "gates": {"nope": 1}}, "unknown"),
        ({"canonical": "a", "shadow": "b", "gates": {"max_aa_ratio": 0.9}}, "max_aa_ratio"),
        ({"canonical": "a", "shadow": "b", "timing_pause_ms": -1}, "timing_pause_ms"),
    ],
)
def test_bad_pairs_are_refused(spec, msg):
    with pytest.raises(InvalidArgument, match=msg):
        parse_pair("embeddings", spec)


def timed_batch(log_ratio: float, i: int):
    """A timed batch whose estimate is `log_ratio`, in the order of batch `i`."""
    r = math.exp(log_ratio)
    return (1.0, r, 1.0, False) if i % 2 == 0 else (r, 1.0, r, True)


def test_math_of_the_upper_bound():
    """40 batches: blocks of isqrt(40) = 6, six of them, the oldest 4 batches left out;
    Student's t with 5 degrees of freedom over the block means."""
    ratios = [1.0, 1.1, 0.9, 1.05, 0.95] * 8
    t = estimate([timed_batch(math.log(r), i) for i, r in enumerate(ratios)])
    blocks = np.log(ratios)[4:].reshape(6, 6).mean(axis=1)
    m, sd = blocks.mean(), blocks.std(ddof=1)
    assert t.ratio == pytest.approx(math.exp(m)) and t.blocks == 6 and t.batches == 40
    assert t.upper == pytest.approx(math.exp(m + 2.015048 * sd / math.sqrt(6)), rel=1e-6)
