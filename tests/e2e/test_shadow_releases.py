"""Releases through a real server: `ragplane shadow record-release` writes the live evidence
to the history beside koder.toml, refuses failing evidence, and G3 counts the history; a
declared shadow that cannot load is one WARNING and a reason in ShadowStatus."""

from __future__ import annotations

import json
import logging

import grpc
import pytest
from typer.testing import CliRunner

from ragplane.server.cli import app
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.shadow.releases import FILE_NAME
from ragplane.server.shadow.signing import Signer
from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.texts import corpus
from ragplane.v1 import admin_pb2, embed_pb2

pytestmark = pytest.mark.e2e

KODER = """
[self_hosted.embeddings]
canonical = "fake"
shadow = "{shadow}"
sample_rate = 1.0
timing_rate = 1.0

[self_hosted.embeddings.gates]
min_samples = 40
min_probes = 5
min_timed_batches = 5
max_time_ratio = {max_ratio}
# the fake embedders take microseconds: their A/A floor is noise, and the minimum shadow
# time and batches of a release are for real releases
max_aa_ratio = 1e9
min_release_hours = 0
min_release_batches = 0
min_releases = 2
"""


def start(tmp_path, name, shadow=None, *, max_ratio=1e9, shadow_name="fake", **overrides):
    koder = tmp_path / "koder.toml"
    trusted = koder.read_text().partition("[release_keys]")[2] if koder.exists() else ""
    koder.write_text(
        KODER.format(shadow=shadow_name, max_ratio=max_ratio)
        + (f"\n[release_keys]{trusted}" if trusted else "")
    )
    return InProcessServer(
        tmp_path / name,
        koder_toml=str(koder),
        shadow_embedders={"embeddings": shadow} if shadow else None,
        **overrides,
    )


def traffic(srv) -> None:
    texts = corpus(200)
    for i in range(0, 80, 4):
        srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts[i : i + 4]))
    srv.runtime.shadow.drain()
    srv.runtime.shadow.measure_overlap("embeddings")


def cli(srv, *args):
    out = CliRunner().invoke(app, ["shadow", "--addr", f"127.0.0.1:{srv.port}", *args])
    return out.exit_code, out.output


def test_record_release_and_g3_from_the_history(tmp_path):
    history = tmp_path / FILE_NAME
    koder = str(tmp_path / "koder.toml")
    srv = start(tmp_path, "a", FakeEmbedder(version="2"))
    try:
        traffic(srv)
        case = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        g3 = case.gates[2]
        assert not g3.passed and "1 of 2" in g3.value and "fake@2 live" in g3.value
        code, out = cli(srv, "record-release")
        assert code == 0 and "recorded fake@2" in out and "shadow time" in out, out
        signer = Signer.in_dir(tmp_path / "a")  # the measuring server's key
        assert f"signed by key {signer.key_id}" in " ".join(out.split()), out
        code, out = cli(srv, "record-release")
        assert code == 0 and "replaced fake@2" in out, out
        (entry,) = json.loads(history.read_text())["releases"]
        assert entry["signature"]["key_id"] == signer.key_id
        assert entry["shadow"] == "fake@2" and entry["canonical"] == "fake@1"
        assert entry["hardware"] == case.hardware and entry["hardware"].startswith("cpu ")
        assert entry["evidence"]["classes"][0]["name"] == "short"
        assert entry["evidence"]["samples"] >= 40 and entry["evidence"]["timed_batches"] >= 5
        assert entry["recorded_at"] and entry["machine"]
        md = tmp_path / "pairs.md"
        out = CliRunner().invoke(
            app,
            [
                "self-hosted",
                "--addr",
                f"127.0.0.1:{srv.port}",
                "registry",
                "--koder-toml",
                koder,
                "--out",
                str(md),
            ],
        )
        assert out.exit_code == 0, out.output
        text = md.read_text()
        assert "## Release history" in text
        (row,) = [line for line in text.splitlines() if line.startswith("| embeddings | fake@2")]
        assert row.endswith("does not trust | no (signature) |"), row  # koder.toml trusts none
    finally:
        srv.stop()
    # the next release, before koder.toml trusts the measuring server: G3 refuses the entry
    srv = start(tmp_path, "b", FakeEmbedder(version="3"))
    try:
        traffic(srv)
        g3 = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0].gates[2]
        assert not g3.passed and "fake@2: entry refused: signed by key" in g3.value, g3
    finally:
        srv.stop()
    trusted = f'\n[release_keys]\n"{signer.key_id}" = "{signer.public}"\n'
    (tmp_path / "koder.toml").write_text((tmp_path / "koder.toml").read_text() + trusted)
    # the next release: a fresh data directory, the recorded one counts, G3 holds
    srv = start(tmp_path, "b", FakeEmbedder(version="3"))
    try:
        traffic(srv)
        case = srv.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
        g3 = case.gates[2]
        assert g3.passed and "fake@2 recorded, fake@3 live" in g3.value, g3
        assert case.flip_eligible
    finally:
        srv.stop()


def test_record_release_is_judged_by_the_server_and_refuses_failing_evidence(tmp_path):
    """The server that measured a release judges it under its own gates: there is no
    --koder-toml to lend laxer ones and no way to record a failing release."""
    history = tmp_path / FILE_NAME
    srv = start(tmp_path, "slow", FakeEmbedder(version="4"), max_ratio=1e-9)
    try:
        traffic(srv)
        code, out = cli(srv, "record-release")
        out = " ".join(out.split())  # rich wraps long lines
        assert code == 3 and "refused" in out and "G2 performance: short: upper bound" in out, out
        assert "<= 1e-09 (the shadow must get" in out, out
        assert "G1" not in out.split("refused", 1)[1]
        assert not history.exists()
        code, out = cli(srv, "record-release", "--koder-toml", str(tmp_path / "lax.toml"))
        assert code == 2 and "No such option" in out  # no other gates can be lent
        assert not history.exists()
    finally:
        srv.stop()


def test_a_shadow_that_cannot_load_warns_once_and_status_says_why(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        srv = start(
            tmp_path, "broken", shadow_name="embedder_rs", model_dir=str(tmp_path / "no-model")
        )
        try:
            s = srv.stubs
            for i in range(5):
                r = s.embed.Embed(embed_pb2.EmbedRequest(texts=[f"text {i}"]))
                assert r.embedder == "fake@1"  # the canonical answers as if no shadow
            for _ in range(3):
                (case,) = s.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases
            assert case.status == "unavailable" and "embedder_rs" in case.reason
            assert "cannot load" in case.reason and case.serving == "fake@1"
            assert s.admin.Status(admin_pb2.StatusRequest()).shadow[0].status == "unavailable"
            with pytest.raises(grpc.RpcError) as e:
                s.admin.Flip(admin_pb2.FlipRequest(use_case="embeddings", force=True))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "does not run" in e.value.details() and "embedder_rs" in e.value.details()
        finally:
            srv.stop()
    warnings = [r for r in caplog.records if "shadow of embeddings is off" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
