"""The shadow takes only spare capacity: no samples while requests wait."""

from __future__ import annotations

import os
import threading
from dataclasses import replace

import numpy as np

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.shadow.config import PairConfig
from ragplane.server.shadow.evidence import EvidenceStore
from ragplane.server.shadow.manager import ShadowManager
from tests.unit.shadow import LAX


def test_while_requests_wait_the_shadow_takes_its_minimum_share_and_counts_the_rest(tmp_path):
    busy = [True]
    canonical, shadow = FakeEmbedder(), FakeEmbedder(version="2")
    pair = PairConfig("embeddings", "fake", "fake", sample_rate=1.0, min_busy_share=0.25)
    m = ShadowManager(
        {"embeddings": pair},
        canonical,
        {"embeddings": shadow},
        EvidenceStore(tmp_path / "s.db"),
        busy=lambda: busy[0],
    )
    try:
        texts = ["one text", "another text"]
        vecs = canonical.embed(texts, normalize=False)
        for _ in range(8):
            m.observe("embeddings", texts, vecs, 0.01, canonical.identity, [4, 4])
        m.drain()
        (rel,) = m.status()[0].releases
        assert (rel.batches, rel.sampled, rel.busy_sampled, rel.skipped_busy) == (8, 2, 2, 6)
        busy[0] = False
        m.observe("embeddings", texts, np.asarray(vecs), 0.01, canonical.identity, [4, 4])
        m.drain()
        (rel,) = m.status()[0].releases
        assert (rel.batches, rel.sampled, rel.busy_sampled, rel.skipped_busy) == (9, 3, 2, 6)
        assert rel.samples == 6 and rel.cosine_min > 0.9999
    finally:
        m.close()


def test_compatible_reads_gates_once_per_ttl_and_again_after_new_evidence(tmp_path, monkeypatch):
    canonical, shadow = FakeEmbedder(), FakeEmbedder(version="2")
    pairs = {"embeddings": PairConfig("embeddings", "fake", "fake", sample_rate=1.0)}
    m = ShadowManager(pairs, canonical, {"embeddings": shadow}, EvidenceStore(tmp_path / "s.db"))
    reads = []
    real = m._status
    monkeypatch.setattr(m, "_status", lambda case: reads.append(1) or real(case))
    try:
        a, b = canonical.identity, shadow.identity
        assert m.compatible(a, a) and not reads  # same embedder: no read at all
        first = m.compatible(a, b)
        for _ in range(50):  # a burst of searches: one read of the evidence store
            assert m.compatible(b, a) == first
        assert len(reads) == 1
        texts = ["one text", "another text"]
        m.observe("embeddings", texts, canonical.embed(texts, normalize=False), 0.01, a)
        m.drain()
        n = len(reads)
        m.compatible(a, b)
        assert len(reads) == n + 1  # the new sample cleared the cached G1
        assert not m.compatible(a, "other@1")
    finally:
        m.close()


class PriorityProbe(FakeEmbedder):
    """Records the nice value of the thread each embed runs on."""

    def __init__(self, version: str = "1") -> None:
        super().__init__(version=version)
        self.nice: list[int] = []

    def embed(self, texts, normalize=True):
        self.nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return super().embed(texts, normalize)


def test_timings_run_at_the_managers_priority_not_the_niced_workers(tmp_path):
    """An A/B/A timing from the nice-19 worker would slow whichever embedder uses the
    calling thread (ONNX Runtime does, embedder_rs does not), biasing G2."""
    canonical, shadow = PriorityProbe(), PriorityProbe(version="2")
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for timing_rate, expect in ((1.0, {own}), (0.0, {19})):
        pairs = {
            "embeddings": PairConfig(
                "embeddings", "fake", "fake", sample_rate=1.0, timing_rate=timing_rate
            )
        }
        m = ShadowManager(
            pairs, canonical, {"embeddings": shadow}, EvidenceStore(tmp_path / f"{timing_rate}.db")
        )
        try:
            shadow.nice.clear()
            texts = ["one text", "another text"]
            m.observe(
                "embeddings",
                texts,
                canonical.embed(texts, normalize=False),
                0.01,
                canonical.identity,
            )
            m.drain()
            assert set(shadow.nice) == expect, (timing_rate, shadow.nice)
        finally:
            m.close()


class Twinned(FakeEmbedder):
    """Counts its embeds; its timing twin is another instance that counts its own."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.twin: Twinned | None = None

    def embed(self, texts, normalize=True):
        self.calls += 1
        return super().embed(texts, normalize)

    def timing_twin(self):
        if self.twin is None:
            self.twin = Twinned()
        return self.twin


def test_timed_runs_use_the_canonicals_twin_not_the_serving_instance(tmp_path):
    """Timed runs on the instance that serves share its thread pool with the requests being
    served and are slowed more than the shadow's (bench.aa_floor): they run on the twin."""
    canonical, shadow = Twinned(), FakeEmbedder(version="2")
    pairs = {
        "embeddings": PairConfig("embeddings", "fake", "fake", sample_rate=1.0, timing_rate=1.0)
    }
    m = ShadowManager(pairs, canonical, {"embeddings": shadow}, EvidenceStore(tmp_path / "t.db"))
    try:
        texts = ["one text", "another text"]
        vecs = canonical.embed(texts, normalize=False)
        for _ in range(4):
            m.observe("embeddings", texts, vecs, 0.01, canonical.identity, [4, 4])
        m.drain()
        (rel,) = m.status()[0].releases
        assert rel.timed_batches == 4
        assert canonical.calls == 1  # only the served batch above
        assert canonical.twin is not None and canonical.twin.calls >= 4  # A/B/A: twice each
    finally:
        m.close()


def test_auto_flips_once_and_an_admin_unflip_sticks(tmp_path):
    canonical, shadow = FakeEmbedder(), FakeEmbedder(version="2")
    gates = replace(LAX, min_samples=20, min_timed_batches=5, max_time_ratio=1e9)
    cfg = PairConfig(
        "embeddings", "fake", "fake", sample_rate=1.0, timing_rate=1.0, policy="auto", gates=gates
    )
    m = ShadowManager(
        {"embeddings": cfg}, canonical, {"embeddings": shadow}, EvidenceStore(tmp_path / "a.db")
    )

    def traffic(n: int) -> None:
        for i in range(n):
            texts = [f"text {i} {j} about something else" for j in range(4)]
            m.observe("embeddings", texts, canonical.embed(texts, normalize=False), 0.01, "fake@1")
            m.drain()

    try:
        traffic(20)
        assert m.serving("embeddings") == "fake@2"  # flipped by itself
        m.unflip("embeddings")
        traffic(20)
        assert m.serving("embeddings") == "fake@1"  # the admin's unflip holds
        m.flip("embeddings")
        assert [h.action for h in m.status()[0].history] == ["flip", "unflip", "flip"]
    finally:
        m.close()
