"""A memory namespace holds one embedder's vectors: after a forced flip to an embedder that
disagrees with it, remembering into it or recalling from it by meaning is refused
(FAILED_PRECONDITION, naming both embedders and what to do), as for collections; words
alone (lexical recall) and new namespaces still work, and an unflip restores it."""

from __future__ import annotations

import grpc
import pytest

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import admin_pb2, common_pb2, memory_pb2

pytestmark = pytest.mark.e2e

KODER = """
[self_hosted.embeddings]
canonical = "fake"
shadow = "fake"
status = "shadow-active"
sample_rate = 1.0
policy = "manual"
"""


class Disagreeing(FakeEmbedder):
    """A shadow whose vectors differ from the canonical's."""

    def embed(self, texts, normalize=True):
        return super().embed([t + " noise" for t in texts], normalize)


def refused(call) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    return e.value.details()


def test_a_namespace_refuses_text_embedded_by_an_embedder_that_disagrees(tmp_path):
    koder = tmp_path / "koder.toml"
    koder.write_text(KODER)
    srv = InProcessServer(
        tmp_path / "d", embedder=FakeEmbedder(), embedder_name="fake", koder_toml=str(koder),
        shadow_embedders={"embeddings": Disagreeing(version="9")},
    )
    try:
        m, admin = srv.stubs.memory, srv.stubs.admin
        first = m.Remember(memory_pb2.RememberRequest(namespace="notes", text="hello world"))
        case = admin.Flip(admin_pb2.FlipRequest(use_case="embeddings", force=True)).case
        assert case.serving == "fake@9"

        why = refused(lambda: m.Recall(memory_pb2.RecallRequest(namespace="notes", query="hello")))
        assert "fake@1" in why and "fake@9" in why and "unflip" in why
        hybrid = memory_pb2.RecallRequest(
            namespace="notes", query="hello", mode=common_pb2.SEARCH_MODE_HYBRID
        )
        refused(lambda: m.Recall(hybrid))
        why = refused(
            lambda: m.Remember(memory_pb2.RememberRequest(namespace="notes", text="new fact"))
        )
        assert "namespace 'notes'" in why
        # words need no embedder; a new namespace is the serving embedder's
        lexical = m.Recall(memory_pb2.RecallRequest(
            namespace="notes", query="hello", mode=common_pb2.SEARCH_MODE_LEXICAL))
        assert [x.id for x in lexical.memories] == [first.id]
        m.Remember(memory_pb2.RememberRequest(namespace="fresh", text="after the flip"))
        assert m.Recall(memory_pb2.RecallRequest(namespace="fresh", query="flip")).memories

        admin.Unflip(admin_pb2.UnflipRequest(use_case="embeddings"))
        got = m.Recall(memory_pb2.RecallRequest(namespace="notes", query="hello world"))
        assert got.memories[0].id == first.id
        refused(lambda: m.Recall(memory_pb2.RecallRequest(namespace="fresh", query="flip")))
    finally:
        srv.stop()
