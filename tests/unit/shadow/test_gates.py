"""Gate logic on synthetic evidence; G3 over recorded releases (tests/unit/shadow/
test_releases.py covers the history file itself)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.errors import InvalidArgument
from server.shadow.config import Gates, parse_pair
from server.shadow.evidence import EvidenceStore, evaluate_gates

G = Gates(min_samples=100, min_probes=20, min_timed_batches=10)


@pytest.fixture
def store(tmp_path):
    s = EvidenceStore(tmp_path / "shadow.db")
    yield s
    s.close()


def passing(
    store: EvidenceStore,
    release: str,
    *,
    ratio: float = 1.0,
    cos: float = 0.999999,
    errors: int = 0,
    case: str = "embeddings",
) -> None:
    rng = np.random.default_rng(abs(hash(release)) % 2**32)
    store.record_agreement(case, release, [cos] * 150)
    store.record_overlap(case, release, 1.0, 50)
    for _ in range(40):
        base = 0.1 * (1 + 0.01 * rng.standard_normal())
        store.record_timing(case, release, base, base * ratio, base)
    for _ in range(errors):
        store.record_error(case, release)


def test_g1_needs_samples_min_mean_and_overlap(store):
    store.record_agreement("embeddings", "rs@1", [0.999999] * 50)
    (g1, _, _), ok = evaluate_gates(store.releases("embeddings", G), "rs@1", G)
    assert not g1.passed and "50 more compared vectors" in g1.missing and not ok
    store.record_agreement("embeddings", "rs@1", [0.999999] * 60 + [0.9998])
    store.record_overlap("embeddings", "rs@1", 1.0, 50)
    (g1, _, _), _ = evaluate_gates(store.releases("embeddings", G), "rs@1", G)
    assert not g1.passed and "min cosine" in g1.missing
    rel = store.releases("embeddings", G)[0]
    assert rel.samples == 111 and rel.cosine_min == pytest.approx(0.9998)
    assert rel.cosine_p1 == pytest.approx(0.999999)  # 1% of 111 -> the 2nd smallest


def test_p1_is_the_first_percentile(store):
    values = np.linspace(0.99, 1.0, 1000)
    store.record_agreement("c", "r@1", values[:500].tolist())
    store.record_agreement("c", "r@1", values[500:].tolist())
    rel = store.releases("c", G)[0]
    assert rel.cosine_p1 == pytest.approx(np.sort(values)[9])
    assert rel.cosine_mean == pytest.approx(values.mean())


def test_g2_upper_bound_and_aa_floor(store):
    passing(store, "fast@1", ratio=0.8)
    passing(store, "slow@1", ratio=1.2)
    rels = {r.shadow: r for r in store.releases("embeddings", G)}
    assert rels["fast@1"].passed_g2 and rels["fast@1"].time_ratio == pytest.approx(0.8, rel=0.02)
    assert rels["fast@1"].time_ratio_upper >= rels["fast@1"].time_ratio
    assert rels["fast@1"].aa_time_ratio == pytest.approx(1.0)
    assert not rels["slow@1"].passed_g2
    (_, g2, _), _ = evaluate_gates(list(rels.values()), "slow@1", G)
    assert "faster" in g2.missing


def test_g2_needs_enough_batches(store):
    store.record_timing("embeddings", "rs@1", 0.1, 0.05, 0.1)
    (_, g2, _), _ = evaluate_gates(store.releases("embeddings", G), "rs@1", G)
    assert not g2.passed and "9 more timed batches" in g2.missing


def test_g3_counts_recorded_passing_releases_without_errors_plus_the_live_one(store):
    passing(store, "rs@0.1.0")
    passing(store, "rs@0.1.1", errors=1)  # errors: does not count
    passing(store, "rs@0.1.2", ratio=1.3)  # too slow: does not count
    passing(store, "rs@0.1.3")
    recorded = store.releases("embeddings", G)[:3]  # 0.1.0-0.1.2 were recorded
    live = store.releases("embeddings", G)
    gates, ok = evaluate_gates(live, "rs@0.1.3", G, recorded)
    assert gates[0].passed and gates[1].passed and not gates[2].passed and not ok
    assert "2 of 3" in gates[2].value and "1 more" in gates[2].missing
    assert "rs@0.1.0 recorded, rs@0.1.3 live" in gates[2].value
    # releases this data directory saw but nobody recorded do not count
    gates, _ = evaluate_gates(live, "rs@0.1.3", G)
    assert "1 of 3" in gates[2].value
    passing(store, "rs@0.2.0")
    recorded = [r for r in store.releases("embeddings", G) if r.shadow != "rs@0.2.0"]
    gates, ok = evaluate_gates(store.releases("embeddings", G), "rs@0.2.0", G, recorded)
    assert gates[2].passed and ok
    assert "rs@0.1.0 recorded, rs@0.1.3 recorded, rs@0.2.0 live" in gates[2].value
    # a release recorded and live at once counts once
    gates, _ = evaluate_gates(live, "rs@0.1.3", G, recorded)
    assert "2 of 3" in gates[2].value
    # the current release must itself pass G1 and G2, however many were recorded
    gates, ok = evaluate_gates(store.releases("embeddings", G), "rs@0.1.2", G, recorded)
    assert not ok and not gates[1].passed


def test_recorded_releases_are_judged_against_todays_gates(store):
    passing(store, "rs@0.1.0")
    recorded = store.releases("embeddings", G)
    strict = Gates(min_samples=1000, min_probes=20, min_timed_batches=10, min_releases=1)
    gates, _ = evaluate_gates([], "rs@9", strict, recorded)
    assert not gates[2].passed and "0 of 1" in gates[2].value  # 150 samples < 1000 now


def test_evidence_persists(tmp_path):
    s = EvidenceStore(tmp_path / "e.db")
    passing(s, "rs@1")
    s.set_serving("embeddings", "rs@1", "flip", True, "test")
    s.close()
    s = EvidenceStore(tmp_path / "e.db")
    assert s.releases("embeddings", G)[0].samples == 150
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
    ],
)
def test_bad_declarations_are_clear(spec, msg):
    with pytest.raises(InvalidArgument, match=msg):
        parse_pair("embeddings", spec)


def test_math_of_the_upper_bound(store):
    ratios = [1.0, 1.1, 0.9, 1.05, 0.95] * 8
    for r in ratios:
        store.record_timing("c", "r@1", 1.0, r, 1.0)
    rel = store.releases("c", G)[0]
    logs = np.log(ratios)
    m, sd = logs.mean(), logs.std(ddof=1)
    assert rel.time_ratio == pytest.approx(math.exp(m))
    assert rel.time_ratio_upper == pytest.approx(math.exp(m + 1.6448536 * sd / math.sqrt(40)))
