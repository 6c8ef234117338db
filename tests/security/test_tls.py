"""TLS and mutual TLS from certificate files made at test time (trustme)."""

from __future__ import annotations

import grpc
import pytest
import trustme

from ragplane.core.errors import InvalidArgument
from ragplane.server.app import create_server
from ragplane.server.settings import Settings
from ragplane.v1 import embed_pb2, embed_pb2_grpc

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


def _serve(tmp_path, ca, client_ca: trustme.CA | None = None):
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(tmp_path / "server.pem"), append=True)
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    values = {
        "host": "127.0.0.1",
        "port": 0,
        "data_dir": str(tmp_path / "data"),
        "embedder": "fake",
        "koder_toml": "",
        "tls_cert": str(tmp_path / "server.pem"),
        "tls_key": str(tmp_path / "server.key"),
    }
    if client_ca is not None:
        client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.pem"))
        values["tls_client_ca"] = str(tmp_path / "client-ca.pem")
    server, port, runtime = create_server(Settings.from_mapping(values))
    server.start()
    return server, port, runtime


def _embed(channel: grpc.Channel) -> embed_pb2.EmbedResponse:
    return embed_pb2_grpc.EmbedServiceStub(channel).Embed(
        embed_pb2.EmbedRequest(texts=["over tls"]), timeout=10
    )


def _fails(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        _embed(channel)
    return e.value.code()


def _client_creds(ca: trustme.CA, client: trustme.CA | None = None, name="client@example"):
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    leaf = client.issue_cert(name)
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=leaf.private_key_pem.bytes(),
        certificate_chain=b"".join(p.bytes() for p in leaf.cert_chain_pems),
    )


def test_tls_client_with_the_ca_works_plaintext_and_untrusting_clients_fail(tmp_path, ca):
    server, port, runtime = _serve(tmp_path, ca)
    target = f"localhost:{port}"
    try:
        with grpc.secure_channel(target, _client_creds(ca)) as ch:
            assert _embed(ch).dim == 64
        with grpc.insecure_channel(target) as ch:
            assert _fails(ch) == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(target, _client_creds(trustme.CA())) as ch:  # another CA
            assert _fails(ch) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0).wait()
        runtime.close()


def test_mutual_tls_requires_a_client_cert_signed_by_the_client_ca(tmp_path, ca):
    client_ca = trustme.CA()
    server, port, runtime = _serve(tmp_path, ca, client_ca=client_ca)
    target = f"localhost:{port}"
    try:
        with grpc.secure_channel(target, _client_creds(ca, client_ca)) as ch:
            assert _embed(ch).dim == 64
        with grpc.secure_channel(target, _client_creds(ca)) as ch:  # no client cert
            assert _fails(ch) == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(target, _client_creds(ca, trustme.CA())) as ch:  # wrong CA
            assert _fails(ch) == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(target) as ch:
            assert _fails(ch) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0).wait()
        runtime.close()


def test_unreadable_certificate_files_are_refused_clearly(tmp_path):
    values = {
        "host": "127.0.0.1",
        "port": 0,
        "data_dir": str(tmp_path / "data"),
        "embedder": "fake",
        "koder_toml": "",
        "tls_cert": str(tmp_path / "missing.pem"),
        "tls_key": str(tmp_path / "missing.key"),
    }
    with pytest.raises(InvalidArgument, match="tls_cert"):
        create_server(Settings.from_mapping(values))
