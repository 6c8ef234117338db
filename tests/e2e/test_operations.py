"""Operations: Prometheus metrics on their own port, JSON logs with request ids,
`ragplane config show` with secrets redacted."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request

import pytest
from typer.testing import CliRunner

from ragplane.server.cli import app
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import common_pb2, embed_pb2, index_pb2, search_pb2

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def value(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{prefix} not in metrics:\n{text[:3000]}")


def test_metrics(tmp_path):
    koder = tmp_path / "k.toml"
    koder.write_text(
        '[self_hosted.embeddings]\ncanonical = "fake"\nshadow = "fake"\nsample_rate = 1.0\n'
    )
    port = free_port()
    srv = InProcessServer(
        tmp_path / "d",
        metrics_port=port,
        koder_toml=str(koder),
        shadow_embedders={"embeddings": FakeEmbedder(version="2")},
    )
    try:
        s = srv.stubs
        s.embed.Embed(embed_pb2.EmbedRequest(texts=["a b", "c d"]))
        s.embed.Embed(embed_pb2.EmbedRequest(texts=["e f"]))
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection="docs",
                items=[common_pb2.Item(id=str(i), text=f"text {i}") for i in range(3)],
            )
        )
        s.search.Search(search_pb2.SearchRequest(collection="docs", text="text", top_k=2))
        try:
            s.search.Search(search_pb2.SearchRequest(collection="nope", text="x", top_k=2))
        except Exception:
            pass
        srv.runtime.shadow.drain()
        text = scrape(port)
        assert value(text, 'ragplane_requests_total{code="OK",method="EmbedService/Embed"}') == 2
        assert (
            value(text, 'ragplane_requests_total{code="NOT_FOUND",method="SearchService/Search"}')
            == 1
        )
        assert value(text, 'ragplane_request_seconds_count{method="IndexService/Upsert"}') == 1
        assert value(text, "ragplane_embed_batch_texts_count") >= 3
        assert value(text, "ragplane_embed_batch_texts_sum") == 3 + 3 + 1  # texts embedded
        assert value(text, 'ragplane_collection_items{collection="docs",tenant="default"}') == 3
        assert value(text, "ragplane_embed_queue_texts") == 0
        assert (
            value(text, 'ragplane_shadow_cosine{shadow="fake@2",stat="min",use_case="embeddings"}')
            > 0.9999
        )
        assert value(text, 'ragplane_shadow_gate{gate="G1",use_case="embeddings"}') == 0
        assert value(text, 'ragplane_shadow_flipped{use_case="embeddings"}') == 0
    finally:
        srv.stop()


def test_json_logs_carry_request_ids(server, capsys):
    from ragplane.server import logs

    logs.setup("DEBUG", as_json=True)
    try:
        _, call = server.stubs.embed.Embed.with_call(
            embed_pb2.EmbedRequest(texts=["x"]), metadata=[("x-request-id", "req-42")]
        )
    finally:
        logging.getLogger().handlers.clear()
        logging.getLogger().setLevel(logging.WARNING)
    lines = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    mine = [x for x in lines if x["msg"].startswith("/ragplane.v1.EmbedService/Embed OK")]
    assert mine and mine[0]["request_id"] == "req-42" and mine[0]["level"] == "DEBUG"
    assert mine[0]["logger"] == "ragplane.server.interceptors" and mine[0]["ts"].endswith("Z")
    assert dict(call.trailing_metadata())["x-request-id"] == "req-42"


def test_config_show_redacts_secrets(tmp_path, monkeypatch):
    cfg = tmp_path / "ragplane.toml"
    cfg.write_text('[ragplane]\nport = 6001\nbootstrap_admin_key = "topsecret"\n')
    monkeypatch.setenv("RAGPLANE_WORKERS", "7")
    out = CliRunner().invoke(
        app, ["config", "show", "--config", str(cfg), "--json", "--set", "log_json=true"]
    )
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert shown["port"] == 6001 and shown["workers"] == 7 and shown["log_json"] is True
    assert shown["bootstrap_admin_key"] == "***" and "topsecret" not in out.output
    out = CliRunner().invoke(app, ["config", "show", "--set", "prot=1"])
    assert out.exit_code == 2 and "unknown setting" in out.output
