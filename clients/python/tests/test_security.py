"""API keys and TLS: the key travels as `authorization: Bearer <key>` on every call (the
client's methods and its raw stubs, sync and async), a key is refused over plaintext unless
allowed, and TLS verifies the server against a root certificate (trustme, made here)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ragplane_client import NO_RETRY, AsyncClient, Client
from ragplane_client.v1 import index_pb2

from fakes import FakeServer


@pytest.fixture
def keyed(server):
    secret = server.runtime.keys.create("acme", ["read", "write"])[1]
    return f"127.0.0.1:{server.port}", secret


def test_the_api_key_is_sent_and_checked(keyed):
    target, secret = keyed
    with Client(target, api_key=secret, allow_plaintext_key=True) as c:
        c.create_collection("mine")
        assert [x.name for x in c.list_collections()] == ["mine"]
        raw = c.stubs.index.ListCollections(index_pb2.ListCollectionsRequest(), timeout=10)
        assert [x.name for x in raw.collections] == ["mine"]
    with Client(target) as c, pytest.raises(grpc.RpcError) as e:
        c.list_collections()
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with Client(target, api_key="rpk_000000000000_nope", allow_plaintext_key=True) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.list_collections()
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_async_client_sends_the_key_on_every_kind_of_call(keyed):
    target, secret = keyed

    async def go():
        async with AsyncClient(target, api_key=secret, allow_plaintext_key=True) as c:
            await c.create_collection("mine")
            raw = await c.stubs.index.ListCollections(index_pb2.ListCollectionsRequest())
            return [x.name for x in raw.collections]

    assert asyncio.run(go()) == ["mine"]


def test_every_metadata_kind_carries_the_key():
    srv = FakeServer()
    try:
        with Client(srv.target, api_key="k1", allow_plaintext_key=True) as c:
            c.embedder_info()
            c.upsert("c", [{"id": "1"}])

        async def go():
            async with AsyncClient(srv.target, api_key="k2", allow_plaintext_key=True) as c:
                await c.embedder_info()

        asyncio.run(go())
        assert [m.get("authorization") for m in srv.script.metadata] == [
            "Bearer k1",
            "Bearer k1",
            "Bearer k2",
        ]
    finally:
        srv.stop()


def test_a_key_without_tls_is_refused_unless_allowed():
    with pytest.raises(ValueError, match="needs TLS"):
        Client("127.0.0.1:1", api_key="secret")
    with pytest.raises(ValueError, match="needs TLS"):
        AsyncClient("127.0.0.1:1", api_key="secret")
    with pytest.raises(ValueError, match="go together"):
        Client("127.0.0.1:1", client_certificate=b"x")
    Client("127.0.0.1:1", api_key="secret", tls=True).close()


@pytest.fixture
def tls_server(tmp_path):
    trustme = pytest.importorskip("trustme")
    from ragplane.server.app import create_server
    from ragplane.server.settings import Settings

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    settings = Settings.from_mapping(
        {
            "host": "127.0.0.1",
            "port": 0,
            "data_dir": str(tmp_path / "data"),
            "embedder": "fake",
            "koder_toml": "",
            "tls_cert": str(tmp_path / "server.pem"),
            "tls_key": str(tmp_path / "server.key"),
        }
    )
    server, port, runtime = create_server(settings)
    server.start()  # not the harness's InProcessServer: it dials without TLS
    yield f"localhost:{port}", tmp_path / "ca.pem"
    server.stop(0).wait()
    runtime.close()


def test_tls_with_a_root_certificate(tls_server):
    target, ca = tls_server
    with Client(target, root_certificates=ca) as c:
        assert c.embed(["over tls"]).dim == 64
    with Client(target, root_certificates=ca.read_bytes()) as c:
        assert c.embedder_info().dim == 64
    with Client(target, retry=NO_RETRY, timeout=5) as plain, pytest.raises(grpc.RpcError) as e:
        plain.embedder_info()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    async def go():
        async with AsyncClient(target, root_certificates=ca) as c:
            return (await c.embed(["over tls"])).dim

    assert asyncio.run(go()) == 64
