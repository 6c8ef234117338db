"""Every sampled batch ends as evidence: a shadow that gives NaN, another dimension,
another number of vectors, or raises, is counted as an error that fails the gates, never
logged and dropped; a sample that cannot be recorded is counted as dropped. After a flip,
the watch unflips a serving shadow that gets slow."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.core.errors import FailedPrecondition, StorageFull
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.shadow.config import Gates, PairConfig
from ragplane.server.shadow.evidence import EvidenceStore
from ragplane.server.shadow.manager import ShadowManager
from tests.unit.shadow import LAX


class Broken(FakeEmbedder):
    """A shadow whose output is wrong in one way."""

    def __init__(self, how: str) -> None:
        super().__init__(version="2")
        self.how = how

    def embed(self, texts, normalize=True):
        out = super().embed(texts, normalize)
        if self.how == "nan":
            out[len(out) // 2, 3] = np.nan
        elif self.how == "inf":
            out[0, 0] = np.inf
        elif self.how == "dim":
            out = out[:, :-1]
        elif self.how == "count":
            out = out[:-1]
        elif self.how == "raises":
            raise RuntimeError("the shadow's backend fell over")
        return out


def manager(tmp_path, shadow, canonical=None, **cfg):
    canonical = canonical or FakeEmbedder()
    gates = cfg.pop("gates", LAX)
    pair = PairConfig("embeddings", "fake", "fake", sample_rate=1.0, gates=gates, **cfg)
    store = EvidenceStore(tmp_path / "shadow.db")
    m = ShadowManager({"embeddings": pair}, canonical, {"embeddings": shadow}, store)
    m.embedders = {e.identity: e for e in (canonical, shadow)}
    return m, canonical


def send(m, canonical, n: int, words: int = 4) -> None:
    """`n` batches answered by whichever embedder serves, offered to the shadow."""
    for i in range(n):
        texts = [f"text {i} {j} " + "word " * words for j in range(4)]
        serving = m.embedders[m.serving("embeddings")]
        m.observe(
            "embeddings",
            texts,
            serving.embed(texts, normalize=False),
            0.01,
            serving.identity,
            canonical.count_tokens(texts),
        )
        m.drain()


@pytest.mark.parametrize(
    "how,message",
    [
        ("nan", "NaN or infinite values in 1 of 4 vectors"),
        ("inf", "NaN or infinite values in 1 of 4 vectors"),
        ("dim", "shape (4, 63) where (4, 64) was expected"),
        ("count", "shape (3, 64) where (4, 64) was expected"),
        ("raises", "RuntimeError: the shadow's backend fell over"),
    ],
)
def test_every_bad_shadow_output_is_counted_and_fails_the_gates(tmp_path, how, message):
    m, canonical = manager(tmp_path, Broken(how))
    try:
        send(m, canonical, 8)
        (st,) = m.status()
        (rel,) = st.releases
        assert rel.errors == 8 and rel.batches == 8 and rel.dropped == 0  # none vanished
        assert message in rel.last_error
        g1 = st.gates[0]
        assert not g1.passed and "no shadow errors (8; last: " in g1.missing
        assert not st.flip_eligible and not st.gates[2].passed
    finally:
        m.close()


def test_a_bad_batch_among_good_ones_still_fails_g1(tmp_path):
    class Sometimes(Broken):
        calls = 0

        def embed(self, texts, normalize=True):
            self.calls += 1
            self.how = "nan" if self.calls == 5 else ""
            return super().embed(texts, normalize)

    m, canonical = manager(tmp_path, Sometimes(""), timing_rate=0.0)  # one shadow call a batch
    try:
        send(m, canonical, 20)
        (st,) = m.status()
        (rel,) = st.releases
        assert rel.errors == 1 and rel.batches == 20 and rel.samples == 19 * 4
        assert not st.gates[0].passed
    finally:
        m.close()


def test_a_sample_that_cannot_be_recorded_is_counted_as_dropped(tmp_path, monkeypatch):
    m, canonical = manager(tmp_path, FakeEmbedder(version="2"))
    try:
        real = m.store.record_agreement

        def full(*a, **kw):
            raise StorageFull("the disk of the data directory is full")

        monkeypatch.setattr(m.store, "record_agreement", full)
        send(m, canonical, 3)
        monkeypatch.setattr(m.store, "record_agreement", real)
        send(m, canonical, 2)
        (rel,) = m.status()[0].releases
        assert rel.dropped == 3 and rel.samples == 2 * 4
    finally:
        m.close()


class Slowable(FakeEmbedder):
    """The shadow, whose speed the test turns down after the flip."""

    def __init__(self) -> None:
        super().__init__(version="2")
        self.delay_s = 0.005


def test_the_watch_unflips_a_shadow_that_got_slow_after_the_flip(tmp_path):
    canonical = FakeEmbedder(delay_s=0.010)  # long enough that a loaded machine is noise
    shadow = Slowable()
    m, _ = manager(tmp_path, shadow, canonical, timing_rate=1.0, policy="auto")
    try:
        send(m, canonical, 20)
        (st,) = m.status()
        assert st.serving == "fake@2", [g.missing for g in st.gates]  # flipped by itself
        assert st.history[-1].reason == "automatic: every gate holds"
        send(m, canonical, 3)
        assert m.serving("embeddings") == "fake@2"  # the watch holds while it is fast
        shadow.delay_s = 0.030  # now 3x the canonical
        send(m, canonical, 12)
        (st,) = m.status()
        assert st.serving == "fake@1"
        last = st.history[-1]
        assert last.action == "unflip" and not last.forced
        assert last.reason.startswith("watch: short: time ratio upper bound")
        send(m, canonical, 5)
        assert m.serving("embeddings") == "fake@1"  # auto does not flip the same release back
    finally:
        m.close()


def test_the_watch_unflips_on_an_error_and_bars_the_release_until_a_new_one(tmp_path):
    shadow = Broken("")
    gates = Gates(**{**LAX.__dict__, "max_time_ratio": 1e9, "max_aa_ratio": 1e9})
    m, canonical = manager(tmp_path, shadow, gates=gates, timing_rate=1.0)
    try:
        send(m, canonical, 12)
        m.flip("embeddings")  # every gate holds
        send(m, canonical, 2)
        (st,) = m.status()
        assert st.serving == "fake@2" and [g.name for g in st.watch] == ["watch G1", "watch G2"]
        shadow.how = "nan"
        send(m, canonical, 1)
        (st,) = m.status()
        assert st.serving == "fake@1" and "watch: 1 shadow error(s)" in st.history[-1].reason
        shadow.how = ""
        send(m, canonical, 4)  # the shadow phase looks clean again...
        (st,) = m.status()
        assert st.gates[0].passed and not st.flip_eligible  # ...but the watch's record stays
        assert "1 shadow error(s)" in st.barred and st.watch_releases[0].errors == 1
        with pytest.raises(FailedPrecondition, match="the watch of fake@2 failed"):
            m.flip("embeddings")
        assert m.flip("embeddings", force=True).serving == "fake@2"  # an admin may force it
    finally:
        m.close()
    # a restart keeps the bar; a new release starts clean
    again, canonical = manager(tmp_path, Broken(""), gates=gates, timing_rate=1.0)
    try:
        (st,) = again.status()
        assert st.barred and not st.flip_eligible
    finally:
        again.close()
    fixed = Broken("")
    fixed.version = "3"
    new, canonical = manager(tmp_path, fixed, gates=gates, timing_rate=1.0)
    try:
        new.unflip("embeddings")
        send(new, canonical, 12)
        (st,) = new.status()
        assert st.shadow == "fake@3" and not st.barred and st.flip_eligible, st.gates
    finally:
        new.close()


def test_the_watch_reports_but_does_not_undo_a_forced_flip(tmp_path):
    shadow = Broken("")
    m, canonical = manager(tmp_path, shadow)
    try:
        m.flip("embeddings", force=True)  # no evidence at all: the admin's call
        shadow.how = "nan"
        send(m, canonical, 2)
        (st,) = m.status()
        assert st.serving == "fake@2" and not st.watch[0].passed
        assert "2 shadow error(s)" in st.watch[0].missing
    finally:
        m.close()
