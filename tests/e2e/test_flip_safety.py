"""After the flip: a serving shadow's bad vectors never reach a client or the store, the
case unflips at once with the reason, the failed watch bars that release for good, and
the evidence covers busy hours (every offered batch accounted for)."""

from __future__ import annotations

import json
import threading
import urllib.request

import grpc
import numpy as np
import pytest

from ragplane.server.embedding.base import l2_normalize
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.texts import corpus
from ragplane.v1 import admin_pb2, common_pb2, index_pb2, search_pb2
from tests.e2e.test_openai_http import free_port
from tests.e2e.test_shadow import embed, start

pytestmark = pytest.mark.e2e


class Faulty(FakeEmbedder):
    """A shadow that agrees with the canonical until `fault` is set: "nan" puts a NaN in
    every vector, "dim" drops the last dimension."""

    fault: str | None = None

    def embed(self, texts, normalize=True):
        out = super().embed(texts, normalize)
        if self.fault == "nan":
            out = out.copy()
            out[:, 0] = np.nan
        elif self.fault == "dim":
            out = out[:, :-1]
        return out


def http_embed(port: int, texts: list[str]) -> list[list[float]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/embeddings",
        data=json.dumps({"input": texts, "model": "any"}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return [d["embedding"] for d in json.loads(r.read())["data"]]


def case(srv) -> admin_pb2.ShadowCase:
    return srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]


def _flip_on_evidence(srv) -> None:
    s = srv.stubs
    for i in range(0, 100, 4):  # enough for G1 and G2 (3 timed batches) in every class
        embed(s, corpus(200)[i + 60 : i + 64])
    srv.runtime.shadow.drain()
    srv.runtime.shadow.measure_overlap("embeddings")
    assert case(srv).flip_eligible, case(srv).gates
    assert s.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings")).case.serving == "fake@2"


def _assert_barred(srv, fault_words: str) -> None:
    s = srv.stubs
    c = case(srv)
    assert c.serving == "fake@1" and not c.flip_eligible
    assert c.barred and fault_words in c.barred, c.barred
    assert "barred by its watch" in c.gates[2].value and not c.gates[2].passed
    assert c.watch_releases[0].shadow == "fake@2" and c.watch_releases[0].errors >= 1
    for call in (
        lambda: s.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings")),
        lambda: s.admin.RecordRelease(admin_pb2.RecordReleaseRequest(use_case="embeddings")),
    ):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "watch" in e.value.details() and fault_words in e.value.details()


@pytest.mark.parametrize(("fault", "words"), [("nan", "non-finite"), ("dim", "shape")])
def test_a_flipped_shadows_bad_vectors_never_reach_a_client_or_the_store(tmp_path, fault, words):
    shadow = Faulty(version="2")
    srv = start(tmp_path, shadow, max_ratio=1e9, http_port=free_port())
    canonical = FakeEmbedder()
    try:
        s = srv.stubs
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
        s.index.Upsert(index_pb2.UpsertRequest(collection="docs", items=[
            common_pb2.Item(id=f"d{i}", text=t) for i, t in enumerate(corpus(40))
        ]))  # fmt: skip
        _flip_on_evidence(srv)
        srv.runtime.shadow.cases["embeddings"].experiment.sample_rate = 0.0  # no sampling
        shadow.fault = fault
        texts = corpus(300)[200:250]
        port = srv.runtime.http.port
        for i, t in enumerate(texts):  # 4 x 50 = 200 responses
            r = embed(s, [t, "a second text"])
            vecs = np.array([v.values for v in r.vectors], dtype=np.float32)
            assert r.embedder == "fake@1" and vecs.shape == (2, 64) and np.isfinite(vecs).all()
            s.index.Upsert(index_pb2.UpsertRequest(
                collection="docs", items=[common_pb2.Item(id=f"n{i}", text=t)]
            ))  # fmt: skip
            hits = s.search.Search(search_pb2.SearchRequest(collection="docs", text=t, top_k=3))
            assert hits.embedder == "fake@1" and hits.hits[0].id == f"n{i}"
            assert all(np.isfinite(h.score) for h in hits.hits)
            (h,) = http_embed(port, [t])
            assert len(h) == 64 and np.isfinite(h).all()
        got = s.index.Get(index_pb2.GetRequest(
            collection="docs", ids=[f"n{i}" for i in range(len(texts))], include_vectors=True
        ))  # fmt: skip
        stored = np.array([it.vector for it in got.items], dtype=np.float32)
        assert stored.shape == (len(texts), 64)
        want = l2_normalize(canonical.embed(texts, normalize=False))
        np.testing.assert_allclose(stored, want, atol=1e-6)  # the canonical's, every one
        c = case(srv)
        unflips = [h for h in c.history if h.action == "unflip"]
        assert len(unflips) == 1 and unflips[0].reason.startswith("watch: served output refused")
        assert words in unflips[0].reason
        _assert_barred(srv, words)
        shadow.fault = None  # even fixed, the same release stays barred
        srv.restart()
        _assert_barred(srv, words)
    finally:
        srv.stop()


def test_every_offered_batch_is_sampled_skipped_or_dropped_and_load_is_sampled(tmp_path):
    """8 concurrent clients on a canonical slow enough that requests queue: the shadow
    must neither take everything nor go silent under load."""
    port = free_port()
    srv = start(
        tmp_path, FakeEmbedder(version="2"), max_ratio=1e9,
        canonical=FakeEmbedder(delay_s=0.01), metrics_port=port,
    )  # fmt: skip
    calls_per_client, clients = 25, 8
    try:

        def client(k: int) -> None:
            for i in range(calls_per_client):
                embed(srv.stubs, [f"client {k} call {i} " + " ".join(["word"] * (i % 3 * 20))])

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        srv.runtime.shadow.drain()
        (rel,) = case(srv).releases
        offered = sum(k.batches for k in rel.classes)
        assert offered == clients * calls_per_client == rel.batches
        for k in rel.classes:
            assert k.batches == k.sampled + k.skipped_busy + k.dropped, k
        busy = rel.busy_sampled + rel.skipped_busy
        print(f"\n{offered} offered: {rel.sampled} sampled ({rel.busy_sampled} under load), "
              f"{rel.skipped_busy} skipped busy, {rel.dropped} dropped")  # fmt: skip
        assert rel.skipped_busy > 0  # the machine was busy and the shadow stepped aside...
        # ...but kept its share: every busy batch past the share was tried, and one the
        # full queue refused is a drop (a slow store's worker, PostgreSQL's, drops more)
        assert rel.busy_sampled + rel.dropped >= 0.2 * busy - len(rel.classes)
        assert rel.busy_sampled > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for outcome in ("sampled", "skipped_busy", "dropped", "busy_sampled"):
            assert f'outcome="{outcome}"' in text
        line = next(
            x for x in text.splitlines()
            if x.startswith("ragplane_shadow_batches{") and 'outcome="skipped_busy"' in x
            and 'phase="shadow"' in x and float(x.rsplit(" ", 1)[1]) > 0
        )  # fmt: skip
        assert 'use_case="embeddings"' in line
    finally:
        srv.stop()
