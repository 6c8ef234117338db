"""The shadow in the service: never on the request path, evidence filled in from live
traffic, the flip and unflip, and the embedder-identity check of collections."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.texts import corpus
from ragplane.v1 import admin_pb2, common_pb2, embed_pb2, index_pb2, search_pb2
from tests.native import require_embedder_rs

pytestmark = pytest.mark.e2e

KODER = """
[self_hosted.embeddings]
canonical = "{canonical}"
shadow = "{shadow}"
status = "shadow-active"
sample_rate = {rate}
policy = "{policy}"
timing_rate = 1.0

[self_hosted.embeddings.gates]
min_samples = 40
min_probes = 5
min_timed_batches = 3
max_time_ratio = {max_ratio}
# the fake embedders take microseconds: their A/A floor is noise, and the minimum shadow
# time and batches of a release are for real releases
max_aa_ratio = 1e9
min_release_hours = 0
min_release_batches = 0
min_releases = 1
"""


def start(
    tmp_path,
    shadow,
    *,
    rate=1.0,
    policy="manual",
    max_ratio=1.05,
    canonical=None,
    canonical_name="fake",
    shadow_name="fake",
    name="d",
    **overrides,
):
    koder = tmp_path / f"{name}.toml"
    koder.write_text(
        KODER.format(
            canonical=canonical_name,
            shadow=shadow_name,
            rate=rate,
            policy=policy,
            max_ratio=max_ratio,
        )
    )
    return InProcessServer(
        tmp_path / name,
        embedder=canonical or FakeEmbedder(),
        embedder_name=canonical_name if canonical_name != "fake" else "fake",
        koder_toml=str(koder),
        shadow_embedders={"embeddings": shadow},
        **overrides,
    )


def embed(stubs, texts):
    return stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts))


def test_slow_shadow_changes_no_reply_and_adds_no_latency(tmp_path):
    texts = [[f"sentence {i} about topic {j}" for j in range(4)] for i in range(30)]
    off = InProcessServer(tmp_path / "off")
    on = start(tmp_path, FakeEmbedder(version="2", delay_s=0.3), name="on", shadow_queue_size=2)
    try:
        lat = {"off": [], "on": []}
        for batch in texts:  # interleaved, same batches
            for label, srv in (("off", off), ("on", on)):
                t0 = time.perf_counter()
                r = embed(srv.stubs, batch)
                lat[label].append(time.perf_counter() - t0)
                if label == "off":
                    ref = r
                else:
                    assert r.vectors == ref.vectors and r.embedder == ref.embedder == "fake@1"
        p50_off, p50_on = np.median(lat["off"]), np.median(lat["on"])
        print(
            f"\np50 latency shadow off {p50_off * 1e3:.2f} ms, on (0.3 s shadow) "
            f"{p50_on * 1e3:.2f} ms"
        )
        # The shadow sleeps 0.3 s per batch; were it on the request path, p50 would be >= 0.3 s.
        assert p50_on < p50_off + 0.1
        st = on.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        assert st.releases[0].dropped > 0  # the queue filled and dropped, not blocked
    finally:
        off.stop()
        on.stop()


def test_evidence_gates_flip_and_unflip(tmp_path):
    srv = start(tmp_path, FakeEmbedder(version="2"), max_ratio=1e9)
    try:
        s = srv.stubs
        with pytest.raises(grpc.RpcError) as e:  # no evidence yet
            s.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings"))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "G1 agreement: 40 more compared vectors" in e.value.details()
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection="docs",
                items=[common_pb2.Item(id=str(i), text=t) for i, t in enumerate(corpus(50))],
            )
        )
        for i in range(0, 100, 4):  # enough for G2's 3 timed batches in each class
            embed(s, corpus(200)[i + 60 : i + 64])
        srv.runtime.shadow.drain()
        srv.runtime.shadow.measure_overlap("embeddings")
        case = s.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        rel = case.releases[0]
        assert rel.shadow == "fake@2" and rel.samples >= 40 and rel.cosine_min >= 0.9999
        assert rel.overlap_at_10 == pytest.approx(1.0) and rel.time_ratio > 0
        assert rel.probes > 0 and rel.timed_batches > 0  # how much evidence stands behind
        assert [g.passed for g in case.gates] == [True, True, True], case.gates
        assert case.flip_eligible
        flipped = s.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings")).case
        assert flipped.status == "flipped" and flipped.serving == "fake@2"
        r = embed(s, ["after the flip"])
        assert r.embedder == "fake@2"
        # the collection holds fake@1 vectors; G1 holds for the pair, so search is allowed
        hits = s.search.Search(
            search_pb2.SearchRequest(collection="docs", text=corpus(50)[3], top_k=1)
        )
        assert hits.hits[0].id == "3" and hits.embedder == "fake@2"
        back = s.admin.Unflip(admin_pb2.UnflipRequest(use_case="embeddings")).case
        assert back.serving == "fake@1" and [h.action for h in back.history] == ["flip", "unflip"]
        assert embed(s, ["x"]).embedder == "fake@1"
        srv.runtime.shadow.drain()
        before = s.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        srv.restart()  # flip history and evidence are durable
        case = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        assert [h.action for h in case.history] == ["flip", "unflip"]
        assert case.releases[0] == before.releases[0]
    finally:
        srv.stop()


class Disagreeing(FakeEmbedder):
    """A shadow whose vectors differ from the canonical's."""

    def embed(self, texts, normalize=True):
        return super().embed([t + " noise" for t in texts], normalize)


def test_forced_flip_and_identity_check(tmp_path):
    srv = start(tmp_path, Disagreeing(version="9"))
    try:
        s = srv.stubs
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection="docs", items=[common_pb2.Item(id="1", text="hello world")]
            )
        )
        case = s.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings", force=True)).case
        assert case.serving == "fake@9" and case.history[-1].forced
        with pytest.raises(grpc.RpcError) as e:
            s.search.Search(search_pb2.SearchRequest(collection="docs", text="hello", top_k=1))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "fake@1" in e.value.details() and "fake@9" in e.value.details()
        # vectors are always accepted; a re-embedding rebuild moves the collection over
        progress = list(s.admin.Rebuild(admin_pb2.RebuildRequest(collection="docs")))
        assert progress[-1].phase == "swapped"
        info = s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"))
        assert info.embedder == "fake@9"
        r = s.search.Search(
            search_pb2.SearchRequest(collection="docs", text="hello world", top_k=1)
        )
        assert r.hits[0].id == "1" and r.hits[0].score == pytest.approx(1.0, abs=1e-5)
    finally:
        srv.stop()


def test_auto_policy_flips_when_gates_hold(tmp_path):
    srv = start(tmp_path, FakeEmbedder(version="3"), policy="auto", max_ratio=1e9)
    try:
        for i in range(0, 80, 4):
            embed(srv.stubs, corpus(200)[i : i + 4])
            srv.runtime.shadow.drain()
        case = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        assert case.serving == "fake@3", case.gates
        assert case.history[-1].reason.startswith("automatic")
    finally:
        srv.stop()


def test_unknown_case_and_no_pairs(server, tmp_path):
    with pytest.raises(grpc.RpcError) as e:
        server.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest())
    assert (
        e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "koder.toml" in e.value.details()
    )
    srv = start(tmp_path, FakeEmbedder(version="2"), name="x")
    try:
        with pytest.raises(grpc.RpcError) as e:
            srv.stubs.admin.Flip(admin_pb2.FlipRequest(use_case="nope"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        srv.stop()


@pytest.mark.parity
def test_real_embedder_rs_fills_in_agreement(tmp_path, onnx_model):
    """The shipped pair (canonical model, embedder_rs) at sample rate 1.0 on real text:
    the evidence gets real agreement numbers and G1's cosine criteria hold."""
    require_embedder_rs()
    from ragplane.server.embedding.rust import RustEmbedder

    rust = RustEmbedder(device="cpu")
    srv = start(
        tmp_path,
        rust,
        canonical=onnx_model,
        canonical_name="sentence-transformers",
        shadow_name="embedder_rs",
        max_ratio=1.05,
    )
    try:
        texts = corpus(200)[:96]
        for i in range(0, len(texts), 8):
            r = embed(srv.stubs, texts[i : i + 8])
            assert r.embedder.startswith("onnx@")  # the canonical answers
        srv.runtime.shadow.drain(timeout=600)
        srv.runtime.shadow.measure_overlap("embeddings")
        case = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        rel = case.releases[0]
        print(
            f"\nembedder_rs vs canonical on {rel.samples} real texts: min cos "
            f"{rel.cosine_min:.7f} p1 {rel.cosine_p1:.7f} mean {rel.cosine_mean:.8f} "
            f"overlap@10 {rel.overlap_at_10:.3f}; time ratio {rel.time_ratio:.2f} "
            f"(upper {rel.time_ratio_upper:.2f}, A/A {rel.aa_time_ratio:.2f})"
        )
        assert rel.shadow == rust.identity and rel.samples == len(texts) and rel.errors == 0
        assert rel.cosine_min >= 0.9999 and rel.cosine_mean >= 0.99999
        assert rel.overlap_at_10 >= 0.99 and rel.time_ratio > 0 and rel.aa_time_ratio > 0
        g1 = case.gates[0]
        assert g1.name == "G1 agreement" and g1.passed, g1
    finally:
        srv.stop()
