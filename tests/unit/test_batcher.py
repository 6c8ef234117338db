from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ragplane.core.errors import ResourceExhausted
from ragplane.server.embedding.batcher import EmbedBatcher
from ragplane.server.embedding.fake import FakeEmbedder


class CountingEmbedder(FakeEmbedder):
    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(dim=16, delay_s=delay_s)
        self.passes: list[int] = []

    def embed(self, texts, normalize=True):
        self.passes.append(len(texts))
        return super().embed(texts, normalize)


def test_concurrent_requests_share_forward_passes():
    emb = CountingEmbedder(delay_s=0.02)
    b = EmbedBatcher(emb, max_tokens=4096, max_wait_s=0.005)
    results = {}

    def call(i):
        texts = [f"request {i} text {j}" for j in range(3)]
        results[i] = (texts, b.embed(texts, emb.count_tokens(texts)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b.close()
    assert sum(emb.passes) == 96
    assert len(emb.passes) < 32 / 2, emb.passes  # shared passes, not one per request
    ref = FakeEmbedder(dim=16)
    for texts, vecs in results.values():  # each caller got its own rows, in order
        np.testing.assert_allclose(vecs, ref.embed(texts), atol=1e-6)


def test_token_budget_splits_large_requests_and_keeps_order():
    emb = CountingEmbedder()
    b = EmbedBatcher(emb, max_tokens=40, max_wait_s=0)
    texts = [" ".join(["w"] * 8) + f" {i}" for i in range(10)]  # 11 tokens each
    out = b.embed(texts, emb.count_tokens(texts))
    b.close()
    assert max(emb.passes) * 11 <= 40 and sum(emb.passes) == 10
    np.testing.assert_allclose(out, FakeEmbedder(dim=16).embed(texts), atol=1e-6)


def test_full_queue_is_resource_exhausted_with_retry_after():
    emb = CountingEmbedder(delay_s=0.3)
    b = EmbedBatcher(emb, max_tokens=64, max_wait_s=0, max_queue_texts=4)
    t = threading.Thread(target=lambda: b.embed(["a"] * 4, [3] * 4))
    t.start()
    time.sleep(0.01)
    t2 = threading.Thread(target=lambda: b.embed(["b"] * 4, [3] * 4))
    t2.start()
    time.sleep(0.05)
    with pytest.raises(ResourceExhausted) as e:
        b.embed(["c"] * 4, [3] * 4)
    assert e.value.retry_after > 0 and "queue is full" in str(e.value)
    t.join()
    t2.join()
    b.close()


def test_cancelled_request_is_skipped():
    emb = CountingEmbedder(delay_s=0.1)
    b = EmbedBatcher(emb, max_tokens=8, max_wait_s=0)
    t = threading.Thread(target=lambda: b.embed(["first"], [3]))
    t.start()
    time.sleep(0.02)
    with pytest.raises(TimeoutError):
        b.embed(["never"], [3], is_active=lambda: False)
    t.join()
    b.close()
    assert emb.passes == [1]


def test_embedder_failure_reaches_every_caller():
    class Broken(FakeEmbedder):
        def embed(self, texts, normalize=True):
            raise RuntimeError("boom")

    b = EmbedBatcher(Broken(dim=4), max_wait_s=0)
    with pytest.raises(RuntimeError, match="boom"):
        b.embed(["x"], [3])
    b.close()
