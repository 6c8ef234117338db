"""ItemEmbedding: which embedder may embed for a store (same identity, or a pair the shadow
says agrees), chunks embedded alone with their offsets, and any number of texts embedded in
requests the embedding service accepts."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.core.errors import FailedPrecondition
from ragplane.server import chunking
from ragplane.server.embedded_items import ItemEmbedding
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.embedding.service import EmbeddingService


@pytest.fixture
def service():
    svc = EmbeddingService(FakeEmbedder(max_seq_length=32), max_batch_texts=3)
    yield svc
    svc.close()


def test_the_same_embedder_or_an_agreeing_pair_may_embed_for_a_store(service):
    items = ItemEmbedding(service)
    assert items.embedder_for("fake@1", "namespace 'n'", "the query", "unflip").identity == (
        "fake@1"
    )
    with pytest.raises(FailedPrecondition) as e:
        items.embedder_for("other@2", "namespace 'n'", "the query", "unflip it")
    msg = str(e.value)
    assert "namespace 'n' holds vectors of other@2" in msg and "fake@1" in msg
    assert msg.endswith("unflip it")
    asked = []
    items.set_compatibility(lambda a, b: asked.append((a, b)) or True)
    assert items.embedder_for("other@2", "namespace 'n'", "the query", "").identity == "fake@1"
    assert asked == [("other@2", "fake@1")]


def test_embed_all_splits_into_requests_the_service_accepts(service):
    texts = [f"text number {i}" for i in range(8)]  # more than max_batch_texts (3)
    vectors, identity = ItemEmbedding(service).embed_all(texts, lambda: True)
    assert vectors.shape == (8, service.dim) and identity == "fake@1"
    whole = service.embed(texts[:3]).vectors
    np.testing.assert_allclose(vectors[:3], whole, rtol=1e-6)


def test_chunks_carry_offsets_into_each_text_and_their_own_vectors(service):
    embedder = service.serving_embedder()
    rule = chunking.resolve(None, embedder.max_seq_length)
    long = " ".join(f"word{i}" for i in range(120))
    texts = ["short one", long]
    spans, identity = ItemEmbedding(service).chunks(texts, rule, embedder, lambda: True)
    assert identity == "fake@1" and len(spans[0]) == 1 and len(spans[1]) > 1
    for text, sp in zip(texts, spans, strict=True):
        for s in sp:
            alone = service.embed([text[s.start : s.end]]).vectors[0]
            np.testing.assert_allclose(s.vector, alone, rtol=1e-6)
