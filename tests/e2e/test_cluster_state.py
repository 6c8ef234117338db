"""Two servers on one PostgreSQL store act as one: API keys, the shadow's flip and its
evidence are the cluster's; PostgreSQL gone is UNAVAILABLE with retry-after on every
server, and back without restarting them."""

from __future__ import annotations

import time

import grpc
import pytest

from ragplane.server import auth
from ragplane.server.admin import AdminOps
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.shadow import manager as shadow_manager
from ragplane.testkit import postgres
from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.postgres import until
from ragplane.testkit.texts import corpus
from ragplane.v1 import admin_pb2, embed_pb2, index_pb2
from tests.e2e.test_shadow import KODER

pytestmark = pytest.mark.e2e

ADMIN = "rpk_000000000000_the-clusters-bootstrap-admin-key"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def md(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


def code_of(call, *args, **kw) -> grpc.StatusCode:
    try:
        call(*args, **kw)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def cluster(tmp_path, url: str, n: int = 2, **kw) -> list[InProcessServer]:
    servers: list[InProcessServer] = []
    try:
        for name in "ab"[:n]:
            servers.append(InProcessServer(tmp_path / name, store=url, **kw))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def shadowed(tmp_path, url: str) -> list[InProcessServer]:
    """Two servers with the pair embeddings: fake@1 canonical, fake@2 shadow."""
    koder = tmp_path / "koder.toml"
    koder.write_text(KODER.format(canonical="fake", shadow="fake", rate=1.0, policy="manual",
                                  max_ratio=1e9))  # fmt: skip
    return [
        InProcessServer(
            tmp_path / name,
            store=url,
            embedder=FakeEmbedder(),
            koder_toml=str(koder),
            shadow_embedders={"embeddings": FakeEmbedder(version="2")},
        )  # fmt: skip
        for name in "ab"
    ]


def embedder_of(srv: InProcessServer) -> str:
    return srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["which one?"])).embedder


def test_a_key_made_on_one_server_works_on_the_other_and_its_revocation_too(tmp_path, pg):
    a, b = cluster(tmp_path, pg.create_database("keys"), bootstrap_admin_key=ADMIN)
    try:
        made = a.stubs.admin.CreateKey(
            admin_pb2.CreateKeyRequest(tenant="t1", scopes=["read", "write"]), metadata=md(ADMIN)
        )
        ls = index_pb2.ListCollectionsRequest()

        def answers(srv: InProcessServer) -> grpc.StatusCode:
            return code_of(srv.stubs.index.ListCollections, ls, metadata=md(made.secret))

        seconds = until(lambda: answers(b) == grpc.StatusCode.OK)
        print(f"\nB accepted A's new key after {seconds * 1e3:.0f} ms")
        info = b.stubs.index.CreateCollection(
            index_pb2.CreateCollectionRequest(name="docs"), metadata=md(made.secret)
        )
        seen = index_pb2.ListCollectionsRequest(consistency_token=info.consistency_token)
        listed = a.stubs.index.ListCollections(seen, metadata=md(made.secret)).collections
        assert [c.name for c in listed] == ["docs"]  # the key's tenant, on either server
        assert code_of(b.stubs.index.ListCollections, ls) == grpc.StatusCode.UNAUTHENTICATED
        a.stubs.admin.RevokeKey(
            admin_pb2.RevokeKeyRequest(key_id=made.key.key_id), metadata=md(ADMIN)
        )
        revoked_at = time.monotonic()
        seconds = until(lambda: answers(b) != grpc.StatusCode.OK)
        print(f"B refused it {seconds * 1e3:.0f} ms after its revocation on A")
        time.sleep(max(0.0, revoked_at + auth.MAX_STALE_S - time.monotonic()))
        for srv in (a, b):  # past the bound: refused, as unknown, everywhere
            assert answers(srv) == grpc.StatusCode.UNAUTHENTICATED
        keys = b.stubs.admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=md(ADMIN)).keys
        assert {k.key_id: k.revoked for k in keys}[made.key.key_id]
        assert not (tmp_path / "a" / "keys.db").exists()  # nothing of it on a server's disk
        b.stubs.admin.Snapshot(
            admin_pb2.SnapshotRequest(dir=str(tmp_path / "snap")), metadata=md(ADMIN)
        )
    finally:
        a.stop()
        b.stop()
    # a snapshot is an embedded store: with the cluster's keys, revocations included
    AdminOps.restore(tmp_path / "snap", tmp_path / "restored")
    alone = InProcessServer(tmp_path / "restored", store="sqlite")
    try:
        assert answers(alone) == grpc.StatusCode.UNAUTHENTICATED
        keys = alone.stubs.admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=md(ADMIN)).keys
        assert {k.key_id: k.revoked for k in keys}[made.key.key_id]
    finally:
        alone.stop()


def test_a_flip_through_one_server_is_served_by_the_other(tmp_path, pg):
    a, b = shadowed(tmp_path, pg.create_database("flip"))
    try:
        assert embedder_of(a) == embedder_of(b) == "fake@1"
        case = a.stubs.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings", force=True)).case
        assert case.serving == "fake@2" and embedder_of(a) == "fake@2"
        seconds = until(lambda: embedder_of(b) == "fake@2")
        print(f"\nB served A's flip after {seconds * 1e3:.0f} ms "
              f"(B re-reads every {shadow_manager.FOLLOW_S} s)")  # fmt: skip
        st = b.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        assert st.status == "flipped" and [h.action for h in st.history] == ["flip"]
        assert st.history[-1].forced
        # an unflip through B: A follows, and the history is one for both
        b.stubs.admin.Unflip(admin_pb2.UnflipRequest(use_case="embeddings"))
        until(lambda: embedder_of(a) == "fake@1")
        st = a.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        assert [h.action for h in st.history] == ["flip", "unflip"]
    finally:
        a.stop()
        b.stop()


def test_evidence_recorded_on_both_servers_counts_in_one_status(tmp_path, pg):
    a, b = shadowed(tmp_path, pg.create_database("evidence"))

    def samples(srv: InProcessServer) -> int:
        st = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        return sum(r.samples for r in st.releases)

    try:
        texts = corpus(200)
        for i in range(0, 40, 4):
            a.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts[i : i + 4]))
            a.runtime.shadow.drain()
        from_a = samples(a)
        assert from_a > 0 and samples(b) == from_a  # B's status shows A's evidence
        for i in range(40, 80, 4):
            b.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts[i : i + 4]))
            b.runtime.shadow.drain()
        both = samples(a)
        assert both > from_a and samples(b) == both  # and A's shows B's
        sa = a.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        sb = b.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        assert list(sa.releases) == list(sb.releases) and len(sa.releases) == 1
    finally:
        a.stop()
        b.stop()


def test_postgres_down_is_unavailable_everywhere_and_back_without_restarts(tmp_path):
    """Its own PostgreSQL: this one is stopped and started again."""
    if not postgres.available():
        pytest.skip("PostgreSQL's server binaries are not installed (apt-get install postgresql)")
    with postgres.LocalPostgres() as pg:
        servers = cluster(tmp_path, pg.create_database("down"), bootstrap_admin_key=ADMIN)
        try:
            ls, em = index_pb2.ListCollectionsRequest(), embed_pb2.EmbedRequest(texts=["x"])
            calls = [(s.stubs.index.ListCollections, ls) for s in servers] + [
                (s.stubs.embed.Embed, em) for s in servers
            ]  # a call of the store, and one that needs only the key
            for call, req in calls:
                assert code_of(call, req, metadata=md(ADMIN)) == grpc.StatusCode.OK
            pg.pg_ctl("stop")
            seen: set[grpc.StatusCode] = set()

            def all_unavailable() -> bool:
                codes = [code_of(call, req, metadata=md(ADMIN)) for call, req in calls]
                seen.update(codes)
                return all(c == UNAVAILABLE for c in codes)

            until(all_unavailable)
            assert seen <= {grpc.StatusCode.OK, UNAVAILABLE}, seen  # never INTERNAL
            with pytest.raises(grpc.RpcError) as e:
                servers[0].stubs.embed.Embed(em, metadata=md(ADMIN))
            trailers = dict(e.value.trailing_metadata())
            assert float(trailers["retry-after"]) > 0
            assert "API keys cannot be checked" in e.value.details()
            pg.pg_ctl("start")
            seen.clear()
            until(lambda: all(code_of(call, req, metadata=md(ADMIN)) == grpc.StatusCode.OK
                              for call, req in calls))  # fmt: skip
        finally:
            for s in servers:
                s.stop()
