"""The shadow takes only spare capacity: no samples while requests wait."""

from __future__ import annotations

import numpy as np

from server.embedding.fake import FakeEmbedder
from server.shadow.config import PairConfig
from server.shadow.evidence import EvidenceStore
from server.shadow.manager import ShadowManager


def test_no_samples_while_requests_wait(tmp_path):
    busy = [True]
    canonical, shadow = FakeEmbedder(), FakeEmbedder(version="2")
    pairs = {"embeddings": PairConfig("embeddings", "fake", "fake", sample_rate=1.0)}
    m = ShadowManager(
        pairs,
        canonical,
        {"embeddings": shadow},
        EvidenceStore(tmp_path / "s.db"),
        busy=lambda: busy[0],
    )
    try:
        texts = ["one text", "another text"]
        vecs = canonical.embed(texts, normalize=False)
        m.observe("embeddings", texts, vecs, 0.01, canonical.identity)
        m.drain()
        assert m.status()[0].releases == ()  # nothing sampled while busy
        busy[0] = False
        m.observe("embeddings", texts, np.asarray(vecs), 0.01, canonical.identity)
        m.drain()
        (rel,) = m.status()[0].releases
        assert rel.samples == 2 and rel.cosine_min > 0.9999
    finally:
        m.close()
