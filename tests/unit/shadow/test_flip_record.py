"""Living with a flip, in the gates and the history: G3 counts observed time and compared
batches, a watch that proves nothing ends, and only signed entries count."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ragplane.server.shadow import evidence as evidence_mod
from ragplane.server.shadow.config import Gates
from ragplane.server.shadow.evidence import EvidenceKey, EvidenceStore
from ragplane.server.shadow.gates import (
    g3_shortfall,
    release_evidence,
    stability_gate,
    watch_verdict,
)
from ragplane.server.shadow.releases import FILE_NAME, ReleaseHistory, record_from, sign
from ragplane.server.shadow.signing import Signer
from ragplane.server.shadow.types import ClassEvidence
from tests.unit.shadow.test_releases import evidence as recorded_evidence

HW = "cpu x86_64 avx512"
KEY = EvidenceKey("embeddings", "rs@1", "onnx@1", HW)
G3 = Gates(min_release_hours=24, min_release_batches=50, min_releases=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(evidence_mod.time, "monotonic", c)
    return c


def stored(store: EvidenceStore, key: EvidenceKey = KEY, g: Gates = G3):
    (s,) = [s for s in store.stored(key.use_case, key.phase) if s.key == key]
    return release_evidence(s, g)


def test_ten_minutes_of_traffic_and_one_batch_a_day_later_is_ten_minutes(tmp_path, clock):
    store = EvidenceStore(tmp_path / "s.db")
    try:
        for _ in range(60):  # a batch every 10 s for 10 minutes
            store.record_agreement(KEY, "short", [0.99999999] * 4)
            clock.now += 10
        clock.now += 86_400  # a day later, one more batch
        store.record_agreement(KEY, "short", [0.99999999] * 4)
        ev = stored(store)
    finally:
        store.close()
    assert ev.seconds == pytest.approx(590.0)  # observed gaps only, not the day
    why = g3_shortfall(ev, G3, "onnx@1", HW)
    assert why.startswith("0.2 h of observed shadow time < 24 h"), why


def test_batch_minimums_count_compared_batches_and_mostly_dropped_is_refused(tmp_path, clock):
    store = EvidenceStore(tmp_path / "s.db")
    g = replace(G3, min_release_hours=0, min_release_batches=10)
    try:
        for _ in range(12):
            store.record_agreement(KEY, "short", [0.99999999] * 4)
            clock.now += 1
        for _ in range(30):
            store.record_drop(KEY, "short")
        for _ in range(5):
            store.record_skip(KEY, "short")
        ev = stored(store, g=g)
    finally:
        store.close()
    assert (ev.batches, ev.sampled, ev.compared, ev.dropped, ev.skipped_busy) == (47, 12, 12, 30, 5)
    assert ev.classes[0].batches == 47  # offered = sampled + skipped busy + dropped
    why = g3_shortfall(ev, g, "onnx@1", HW)
    assert "30 of 47 offered batches dropped" in why, why
    # drops are never batches: 12 compared < 20, whatever was dropped
    why = g3_shortfall(ev, replace(g, min_release_batches=20, max_drop_share=1.0), "onnx@1", HW)
    assert why == "12 compared batches < 20", why


def test_busy_traffic_left_unmeasured_holds_g2(tmp_path, clock):
    store = EvidenceStore(tmp_path / "s.db")
    try:
        for i in range(40):
            store.record_agreement(KEY, "short", [0.99999999] * 4, busy=i < 2)
            store.record_timing(KEY, "short", 0.1, 0.1, 0.1, i % 2 == 1)
        for _ in range(38):
            store.record_skip(KEY, "short")  # 2 of 40 busy batches sampled: 5% < 10%
        g = Gates(min_samples=10, min_probes=0, min_overlap=0, min_timed_batches=10)
        ev = stored(store, g=g)
    finally:
        store.close()
    (c,) = ev.classes
    assert (c.busy_sampled, c.skipped_busy) == (2, 38) and not c.passed_g2
    from ragplane.server.shadow.gates import performance_gate

    gate = performance_gate(ev, g)
    assert "busy traffic unmeasured (2 of 40" in gate.missing, gate


def _unproven(timed: int) -> ClassEvidence:
    return ClassEvidence(
        name="short", batches=timed, share=1.0, samples=timed * 4, cosine_min=1.0,
        cosine_mean=1.0, time_ratio=1.0, time_ratio_upper=1.01, aa_time_ratio=1.4,
        bb_time_ratio=1.0, timed_batches=timed, carried=True,
    )  # fmt: skip


def test_a_watch_whose_timings_prove_nothing_unflips_after_the_bound():
    g = Gates(min_samples=10, min_timed_batches=10, watch_unproven_batches=60)
    base = recorded_evidence("rs@1")
    early = replace(base, errors=0, classes=(_unproven(59),))
    _, why = watch_verdict(early, g)
    assert why == ""  # too few batches yet to call it stalled
    late = replace(base, errors=0, classes=(_unproven(60),))
    _, why = watch_verdict(late, g)
    assert "timings still prove nothing after 60 batches" in why, why


def test_only_entries_signed_by_a_trusted_key_count_and_refusals_name_the_entry(tmp_path):
    signer = Signer.in_dir(tmp_path / "data")
    assert Signer.in_dir(tmp_path / "data").key_id == signer.key_id  # the same key again
    assert (tmp_path / "data" / "release-signing.key").stat().st_mode & 0o077 == 0
    path = tmp_path / FILE_NAME
    g = Gates(min_samples=100, min_probes=20, min_timed_batches=30, min_release_hours=0,
              min_release_batches=0, min_releases=3)  # fmt: skip
    h = ReleaseHistory(path, {signer.key_id: signer.public})
    h.record(sign(record_from("embeddings", recorded_evidence("rs@1"), g), signer))
    h.record(record_from("embeddings", recorded_evidence("rs@2"), g))  # unsigned
    h.record(sign(record_from("embeddings", recorded_evidence("rs@3"), g), signer))
    other = Signer.in_dir(tmp_path / "elsewhere")
    h.record(sign(record_from("embeddings", recorded_evidence("rs@4"), g), other))
    data = json.loads(path.read_text())
    data["releases"][2]["evidence"]["time_ratio_upper"] = 0.5  # hand-edited after signing
    path.write_text(json.dumps(data, indent=2))

    reader = ReleaseHistory(path, {signer.key_id: signer.public})
    ok, refused = reader.verified("embeddings")
    assert [r.shadow for r in ok] == ["rs@1"]
    why = dict(refused)
    assert why["rs@2"].startswith("unsigned")
    assert "does not verify" in why["rs@3"] and signer.key_id in why["rs@3"]
    assert other.key_id in why["rs@4"] and "does not trust" in why["rs@4"]
    assert reader.counted("embeddings", g) == ["rs@1"]
    cur = replace(recorded_evidence("rs@5"), canonical="onnx@1", hardware="cpu x86_64 avx2")
    gate = stability_gate(cur, g, [r.evidence for r in ok], "cpu x86_64 avx2", untrusted=refused)
    assert not gate.passed
    for name in ("rs@2", "rs@3", "rs@4"):
        assert f"{name}: entry refused" in gate.value, gate.value
    # re-recording one release keeps every other entry byte for byte (signatures hold)
    reader.record(sign(record_from("embeddings", recorded_evidence("rs@1"), g), signer))
    again = json.loads(path.read_text())["releases"]
    assert again[:3] == data["releases"][1:]


def test_a_barred_release_is_not_counted_live_or_recorded():
    g = Gates(min_samples=100, min_probes=20, min_timed_batches=30, min_release_hours=0,
              min_release_batches=0, min_releases=1)  # fmt: skip
    ev = replace(recorded_evidence("rs@1"), hardware=HW)
    assert stability_gate(ev, g, [], HW).passed
    gate = stability_gate(ev, g, [ev], HW, barred={"rs@1": "1 shadow error(s)"})
    assert not gate.passed and "barred by its watch: 1 shadow error(s)" in gate.value
