"""One real server per test module for the console: the fake embedders (canonical fake@1,
shadow fake@2, every batch sampled and timed), API keys on (an admin key and a read-only
one), the HTTP port serving /console, and a collection of long documents made through the
gRPC API."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest

from ragplane.server.conversions import dict_to_struct
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.texts import corpus
from ragplane.v1 import common_pb2, embed_pb2, index_pb2, memory_pb2

ADMIN_KEY = "console-admin-secret-0123456789"
# the gates a release cannot pass here (min_samples): Flip is refused with their reasons
KODER = """
[self_hosted.embeddings]
canonical = "fake"
shadow = "fake"
status = "shadow-active"
sample_rate = 1.0
timing_rate = 1.0

[self_hosted.embeddings.gates]
min_samples = 1000000
min_probes = 5
min_timed_batches = 3
max_aa_ratio = 1e9
min_release_hours = 0
min_release_batches = 0
min_releases = 1
"""
DOCS = 30


@dataclass
class Console:
    srv: InProcessServer
    admin: str  # the admin key's secret
    reader: str  # a read-only key's secret

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.srv.runtime.http.port}/console"

    def md(self, key: str | None = None):
        return [("authorization", f"Bearer {key or self.admin}")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def document(i: int) -> str:
    """A long text of real prose (several chunks of the fake embedder's 256 words)."""
    return "\n\n".join(corpus(400)[i * 7 : i * 7 + 40])


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    koder = tmp / "koder.toml"
    koder.write_text(KODER)
    srv = InProcessServer(
        tmp / "data", embedder=FakeEmbedder(), koder_toml=str(koder),
        shadow_embedders={"embeddings": FakeEmbedder(version="2")},
        http_port=free_port(), bootstrap_admin_key=ADMIN_KEY,
    )
    _, reader = srv.runtime.keys.create("default", ["read"], "console test: read-only")
    c = Console(srv, ADMIN_KEY, reader)
    s = srv.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"), metadata=c.md())
    items = [common_pb2.Item(id=f"doc-{i}", text=document(i),
                             metadata=dict_to_struct({"n": i, "lang": "en"}))
             for i in range(DOCS)]
    s.index.Upsert(index_pb2.UpsertRequest(collection="docs", items=items), metadata=c.md())
    for i in range(0, 120, 4):  # shadow traffic: short and longer batches, each timed
        texts = corpus(300)[i : i + 4] if i % 8 else [document(i % DOCS)[:1200]]
        s.embed.Embed(embed_pb2.EmbedRequest(texts=texts), metadata=c.md())
    s.memory.Remember(memory_pb2.RememberRequest(namespace="notes", text="the console works",
                                                 ttl_seconds=3600), metadata=c.md())
    srv.runtime.shadow.drain()
    yield c
    srv.stop()
