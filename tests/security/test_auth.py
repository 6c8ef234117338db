"""API keys over gRPC: authentication, scopes, tenant isolation, admin RPCs, and the rule
that a server without keys binds loopback only."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass

from ragplane.core.errors import InvalidArgument
from ragplane.server.app import create_server
from ragplane.server.conversions import dict_to_struct
from ragplane.server.settings import Settings
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import admin_pb2, common_pb2, index_pb2, memory_pb2, search_pb2

pytestmark = pytest.mark.e2e

UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def md(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


def code(call, *args, **kw) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        r = call(*args, **kw)
        if hasattr(r, "__next__"):  # server-streaming
            list(r)
    return e.value.code()


@pytest.fixture
def keyed(tmp_path):
    """A server with keys: tenant a (read+write), a read-only key of a, tenant b
    (read+write), and an admin of tenant a."""
    srv = InProcessServer(tmp_path / "data")
    keys = srv.runtime.keys
    secrets = {
        "a": keys.create("a", ["read", "write"])[1],
        "a-read": keys.create("a", ["read"])[1],
        "b": keys.create("b", ["read", "write"])[1],
        "admin": keys.create("a", ["read", "write", "admin"])[1],
    }
    yield srv, secrets
    srv.stop()


def test_no_unknown_malformed_or_revoked_key_is_unauthenticated(keyed):
    srv, sk = keyed
    req = index_pb2.ListCollectionsRequest()
    lc = srv.stubs.index.ListCollections
    assert code(lc, req) == UNAUTH
    assert code(lc, req, metadata=md("rpk_000000000000_nope")) == UNAUTH
    assert code(lc, req, metadata=md("not-even-the-format")) == UNAUTH
    assert code(lc, req, metadata=(("authorization", f"Basic {sk['a']}"),)) == UNAUTH
    assert code(lc, req, metadata=(("authorization", "Bearer "),)) == UNAUTH
    assert code(lc, req, metadata=md(sk["a"][:-1] + "x")) == UNAUTH  # right id, wrong secret
    lc(req, metadata=md(sk["a"]))
    victim, secret = srv.runtime.keys.create("a", ["read"])
    lc(req, metadata=md(secret))
    srv.runtime.keys.revoke(victim.key_id)
    assert code(lc, req, metadata=md(secret)) == UNAUTH


def test_keys_are_stored_hashed(keyed):
    srv, sk = keyed
    raw = b"".join(p.read_bytes() for p in srv.data_dir.glob("keys.db*"))
    for secret in sk.values():
        assert secret.encode() not in raw


def test_read_key_cannot_write(keyed):
    srv, sk = keyed
    s, ro = srv.stubs, md(sk["a-read"])
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"), metadata=md(sk["a"]))
    item = common_pb2.Item(id="x", text="hello")
    assert (
        code(s.index.CreateCollection, index_pb2.CreateCollectionRequest(name="n"), metadata=ro)
        == DENIED
    )
    assert (
        code(s.index.Upsert, index_pb2.UpsertRequest(collection="docs", items=[item]), metadata=ro)
        == DENIED
    )
    assert (
        code(
            s.index.Delete,
            index_pb2.DeleteRequest(collection="docs", ids=common_pb2.IdList(ids=["x"])),
            metadata=ro,
        )
        == DENIED
    )
    assert (
        code(s.index.DeleteCollection, index_pb2.DeleteCollectionRequest(name="docs"), metadata=ro)
        == DENIED
    )
    assert (
        code(s.memory.Remember, memory_pb2.RememberRequest(namespace="n", text="t"), metadata=ro)
        == DENIED
    )
    assert (
        code(s.memory.Forget, memory_pb2.ForgetRequest(namespace="n", all=True), metadata=ro)
        == DENIED
    )
    # and it can read
    info = s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"), metadata=ro)
    assert info.count == 0


def _seed_tenant_a(s, a, b) -> None:
    """a owns "a-only" and "shared" (one secret item each) and a memory; b owns an empty
    collection also named "shared"."""
    for name in ("a-only", "shared"):
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name=name), metadata=a)
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection=name,
                items=[
                    common_pb2.Item(
                        id="secret-1",
                        text="tenant a private text",
                        metadata=dict_to_struct({"owner": "a"}),
                    )
                ],
            ),
            metadata=a,
        )
    s.memory.Remember(
        memory_pb2.RememberRequest(namespace="notes", text="a's password hint"), metadata=a
    )
    # b has a collection of the same name: its own, empty
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="shared"), metadata=b)


def _assert_invisible(s, b, name: str, q, ids) -> None:
    """Every call of b's on a's collection `name` answers NOT_FOUND."""
    assert (
        code(
            s.index.DescribeCollection,
            index_pb2.DescribeCollectionRequest(name=name),
            metadata=b,
        )
        == NOT_FOUND
    )
    assert (
        code(
            s.index.Get, index_pb2.GetRequest(collection=name, ids=["secret-1"]), metadata=b
        )
        == NOT_FOUND
    )
    assert (
        code(
            s.search.Search,
            search_pb2.SearchRequest(collection=name, vector=q, top_k=5),
            metadata=b,
        )
        == NOT_FOUND
    )
    assert (
        code(
            s.search.Search,
            search_pb2.SearchRequest(collection=name, text="private", top_k=5),
            metadata=b,
        )
        == NOT_FOUND
    )
    assert (
        code(
            s.index.Upsert,
            index_pb2.UpsertRequest(
                collection=name, items=[common_pb2.Item(id="z", text="x")]
            ),
            metadata=b,
        )
        == NOT_FOUND
    )
    assert (
        code(s.index.Delete, index_pb2.DeleteRequest(collection=name, ids=ids), metadata=b)
        == NOT_FOUND
    )
    assert (
        code(
            s.index.DeleteCollection,
            index_pb2.DeleteCollectionRequest(name=name),
            metadata=b,
        )
        == NOT_FOUND
    )


def _assert_own_collection_is_empty(s, b, name: str, q, ids) -> None:
    """b's collection of the same name as a's shows none of a's items."""
    got = s.index.Get(index_pb2.GetRequest(collection=name, ids=["secret-1"]), metadata=b)
    assert list(got.items) == []
    hits = s.search.Search(
        search_pb2.SearchRequest(collection=name, vector=q, top_k=5), metadata=b
    )
    assert list(hits.hits) == []
    assert (
        s.index.Delete(
            index_pb2.DeleteRequest(collection=name, ids=ids), metadata=b
        ).deleted
        == 0
    )


def _assert_memories_isolated(s, a, b) -> None:
    ns = "notes"
    assert (
        code(s.memory.Recall, memory_pb2.RecallRequest(namespace=ns, query="password"), metadata=b)
        == NOT_FOUND
    )
    assert (
        code(s.memory.ListMemories, memory_pb2.ListMemoriesRequest(namespace=ns), metadata=b)
        == NOT_FOUND
    )
    assert (
        code(s.memory.Forget, memory_pb2.ForgetRequest(namespace=ns, all=True), metadata=b)
        == NOT_FOUND
    )
    # b remembering in a namespace of the same name does not touch a's
    r = s.memory.Remember(memory_pb2.RememberRequest(namespace=ns, text="b's own note"), metadata=b)
    mine = s.memory.ListMemories(memory_pb2.ListMemoriesRequest(namespace=ns), metadata=b).memories
    assert [m.id for m in mine] == [r.id]
    # a's data is intact
    assert s.index.Get(
        index_pb2.GetRequest(collection="a-only", ids=["secret-1"]), metadata=a
    ).items
    theirs = s.memory.ListMemories(
        memory_pb2.ListMemoriesRequest(namespace=ns), metadata=a
    ).memories
    assert [m.text for m in theirs] == ["a's password hint"]


def test_tenants_cannot_see_each_others_collections_or_memories(keyed):
    srv, sk = keyed
    s, a, b = srv.stubs, md(sk["a"]), md(sk["b"])
    _seed_tenant_a(s, a, b)
    listed = s.index.ListCollections(index_pb2.ListCollectionsRequest(), metadata=b).collections
    assert [c.name for c in listed] == ["shared"] and listed[0].count == 0
    q = common_pb2.Vector(values=[0.1] * 64)
    ids = common_pb2.IdList(ids=["secret-1"])
    _assert_invisible(s, b, "a-only", q, ids)
    _assert_own_collection_is_empty(s, b, "shared", q, ids)
    _assert_memories_isolated(s, a, b)


def test_a_tenant_name_cannot_reach_the_memory_space(keyed):
    srv, _ = keyed
    with pytest.raises(InvalidArgument):
        srv.runtime.keys.create("memory:a", ["read", "write"])
    with pytest.raises(InvalidArgument):
        srv.runtime.keys.create("a:b", ["read"])


ADMIN_METHODS = list(admin_pb2.DESCRIPTOR.services_by_name["AdminService"].methods)


@pytest.mark.parametrize("method", ADMIN_METHODS, ids=lambda m: m.name)
def test_admin_rpcs_need_the_admin_scope(keyed, method):
    srv, sk = keyed
    cls = GetMessageClass(method.input_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    kind = (
        srv.stubs.channel.unary_stream if method.server_streaming else srv.stubs.channel.unary_unary
    )
    call = kind(
        path,
        request_serializer=cls.SerializeToString,
        response_deserializer=GetMessageClass(method.output_type).FromString,
    )
    for who in ("a", "a-read", "b"):
        assert code(call, cls(), metadata=md(sk[who])) == DENIED, (method.name, who)
    assert code(call, cls()) == UNAUTH


def test_admin_key_can_run_admin_rpcs(keyed):
    srv, sk = keyed
    status = srv.stubs.admin.Status(admin_pb2.StatusRequest(), metadata=md(sk["admin"]))
    assert status.version
    created = srv.stubs.admin.CreateKey(
        admin_pb2.CreateKeyRequest(tenant="c", scopes=["read"]), metadata=md(sk["admin"])
    )
    srv.stubs.index.ListCollections(index_pb2.ListCollectionsRequest(), metadata=md(created.secret))
    assert (
        code(
            srv.stubs.admin.CreateKey,
            admin_pb2.CreateKeyRequest(tenant="memory:a", scopes=["read"]),
            metadata=md(sk["admin"]),
        )
        == grpc.StatusCode.INVALID_ARGUMENT
    )


def _settings(tmp_path, host):
    return Settings.from_mapping(
        {
            "host": host,
            "port": 0,
            "data_dir": str(tmp_path / "d"),
            "embedder": "fake",
            "koder_toml": "",
        }
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_without_keys_a_non_loopback_bind_is_refused(tmp_path, host):
    with pytest.raises(InvalidArgument, match="without API keys"):
        create_server(_settings(tmp_path, host))


def test_without_keys_loopback_binds_and_warns(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ragplane")
    server, port, runtime = create_server(_settings(tmp_path, "127.0.0.1"))
    try:
        assert port > 0
        assert any("no API keys" in r.getMessage() for r in caplog.records)
    finally:
        server.stop(0).wait()
        runtime.close()


@pytest.mark.parametrize("secret", ["rpk_boot01_s3cret-of-the-operator", "any-form-of-secret"])
def test_a_bootstrap_key_of_either_form_authenticates(tmp_path, secret):
    srv = InProcessServer(tmp_path / "data", bootstrap_admin_key=secret)
    try:
        srv.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c"),
                                         metadata=md(secret))
        assert code(srv.stubs.index.ListCollections, index_pb2.ListCollectionsRequest(),
                    metadata=md(secret + "x")) == UNAUTH
    finally:
        srv.stop()
