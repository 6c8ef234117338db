"""The committed release history G3 counts, and how a server finds koder.toml."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.server.shadow import config
from ragplane.server.shadow.config import Gates, discover_koder_toml
from ragplane.server.shadow.releases import (
    FILE_NAME,
    ReleaseHistory,
    history_beside,
    record_from,
    sign,
)
from ragplane.server.shadow.signing import Signer
from ragplane.server.shadow.types import ClassEvidence, ReleaseEvidence
from ragplane.testkit.harness import ROOT

G = Gates(min_samples=100, min_probes=20, min_timed_batches=30)


def evidence(
    shadow: str, *, upper: float = 1.01, errors: int = 0, samples: int = 500, canonical="onnx@1"
):
    classes = (
        ClassEvidence(
            name="short",
            batches=120,
            share=1.0,
            samples=samples,
            cosine_min=0.9999999,
            cosine_mean=0.99999999,
            time_ratio=upper - 0.02,
            time_ratio_upper=upper,
            aa_time_ratio=1.0,
            bb_time_ratio=1.0,
            timed_batches=40,
            errors=errors,
        ),
    )
    return ReleaseEvidence(
        shadow=shadow,
        samples=samples,
        cosine_min=0.9999999,
        cosine_p1=0.9999999,
        cosine_mean=0.99999999,
        overlap_at_10=1.0,
        probes=50,
        time_ratio=upper - 0.02,
        time_ratio_upper=upper,
        aa_time_ratio=1.0,
        timed_batches=40,
        errors=errors,
        canonical=canonical,
        hardware="cpu x86_64 avx2",
        seconds=90_000.0,
        batches=120,
        classes=classes,
    )


def test_record_round_trips_and_a_version_is_never_duplicated(tmp_path):
    h = ReleaseHistory(tmp_path / FILE_NAME)
    assert h.records() == []  # no file yet: an empty history
    first = record_from("embeddings", evidence("embedder_rs@0.1.0"), G, "2 cores")
    assert h.record(first) is False
    h.record(record_from("embeddings", evidence("embedder_rs@0.2.0", upper=1.3), G))
    again = record_from("embeddings", evidence("embedder_rs@0.1.0", samples=900), G)
    assert h.record(again) is True  # re-recording replaces
    got = ReleaseHistory(tmp_path / FILE_NAME).records("embeddings")
    assert [r.shadow for r in got] == ["embedder_rs@0.2.0", "embedder_rs@0.1.0"]
    assert got[1].evidence.samples == 900 and got[1].canonical == "onnx@1"
    assert got[1].hardware == "cpu x86_64 avx2" and got[1].evidence.seconds == 90_000.0
    assert got[1].evidence.passed_g1 and got[1].evidence.passed_g2
    assert got[1].evidence.classes == again.evidence.classes  # per class, as judged
    assert not got[0].evidence.passed_g2 and got[0].gates == G
    # people read and review it: plain JSON, one entry per release
    data = json.loads((tmp_path / FILE_NAME).read_text())
    assert [r["shadow"] for r in data["releases"]] == ["embedder_rs@0.2.0", "embedder_rs@0.1.0"]
    assert data["releases"][1]["evidence"]["time_ratio_upper"] == pytest.approx(1.01)
    assert data["releases"][1]["evidence"]["classes"][0]["name"] == "short"


def test_an_entry_from_before_classes_reads_and_never_passes(tmp_path):
    """The entries recorded before per-class evidence (no classes, hardware or shadow
    time) still parse, and no gate counts them."""
    old = {
        "use_case": "embeddings",
        "shadow": "embedder_rs@0.2.0",
        "canonical": "onnx@1.32.0",
        "evidence": {"samples": 1136, "cosine_min": 0.99999, "time_ratio_upper": 0.88},
    }
    (tmp_path / FILE_NAME).write_text(json.dumps({"releases": [old]}))
    (r,) = ReleaseHistory(tmp_path / FILE_NAME).records()
    assert r.hardware == "" and r.evidence.classes == () and r.evidence.seconds == 0.0
    assert ReleaseHistory(tmp_path / FILE_NAME).counted("embeddings", G) == []


def test_counted_rejudges_against_the_gates_and_skips_errors(tmp_path):
    signer = Signer.in_dir(tmp_path)
    h = ReleaseHistory(tmp_path / FILE_NAME, {signer.key_id: signer.public})
    for case, ev in (
        ("embeddings", evidence("rs@1")),
        ("embeddings", evidence("rs@2", errors=1)),
        ("embeddings", evidence("rs@3", upper=1.2)),
        ("other", evidence("rs@4")),
    ):
        h.record(sign(record_from(case, ev, G), signer))
    assert h.counted("embeddings", G) == ["rs@1"]
    assert h.counted("embeddings", Gates(min_samples=1000)) == []  # stricter gates today


def test_history_sees_a_new_record_without_a_restart(tmp_path):
    path = tmp_path / FILE_NAME
    reader = ReleaseHistory(path)
    assert reader.records() == []
    ReleaseHistory(path).record(record_from("embeddings", evidence("rs@1"), G))
    assert [r.shadow for r in reader.records()] == ["rs@1"]
    ReleaseHistory(path).record(record_from("embeddings", evidence("rs@2"), G))
    assert [r.shadow for r in reader.records()] == ["rs@1", "rs@2"]


@pytest.mark.parametrize(
    "text,msg",
    [
        ("{not json", "not valid JSON"),
        ('{"releases": {}}', "expected"),
        ('{"releases": [{"use_case": "e", "shadow": "rs@1"}]}', "evidence"),
    ],
)
def test_a_garbled_history_names_the_file(tmp_path, text, msg):
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(InvalidArgument, match=msg) as e:
        ReleaseHistory(tmp_path / FILE_NAME).records()
    assert FILE_NAME in str(e.value)


def test_evidence_round_trips_through_shadow_status():
    from ragplane.server.conversions import release_evidence_from_pb, release_evidence_to_pb

    ev = dataclasses.replace(evidence("rs@1", errors=2), dropped=3, passed_g1=True)
    assert release_evidence_from_pb(release_evidence_to_pb(ev)) == ev


def test_history_lives_beside_koder_toml(tmp_path):
    assert history_beside(tmp_path / "koder.toml").path == tmp_path / FILE_NAME
    assert history_beside(None).records() == []


def test_the_repository_history_parses():
    h = history_beside(ROOT / "koder.toml")
    for r in h.records():
        assert r.use_case and "@" in r.shadow and r.recorded_at and r.machine


# -- koder.toml discovery ----------------------------------------------------------------


def test_auto_finds_the_projects_koder_toml_from_any_folder(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # no koder.toml here
    with caplog.at_level(logging.INFO, logger="ragplane.server.shadow.config"):
        found = discover_koder_toml("auto")
    assert found is not None and found.resolve() == (ROOT / "koder.toml").resolve()
    assert any(r.levelno == logging.INFO and str(found) in r.getMessage() for r in caplog.records)


def test_auto_prefers_the_working_directorys_file(tmp_path, monkeypatch):
    (tmp_path / "koder.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert discover_koder_toml("auto") == tmp_path / "koder.toml"


def test_auto_warns_when_nothing_is_found(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config, "_installed_from", lambda: None)
    with caplog.at_level(logging.INFO, logger="ragplane.server.shadow.config"):
        assert discover_koder_toml("auto") is None
    (warn,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "no koder.toml found" in warn.getMessage() and "RAGPLANE_KODER_TOML" in warn.getMessage()


def test_an_explicit_path_must_exist_and_empty_means_none(tmp_path):
    with pytest.raises(InvalidArgument, match="does not exist"):
        discover_koder_toml(str(tmp_path / "missing.toml"))
    assert discover_koder_toml("") is None
    (tmp_path / "k.toml").write_text("")
    assert discover_koder_toml(str(tmp_path / "k.toml")) == tmp_path / "k.toml"


def test_an_installed_server_started_elsewhere_reads_the_projects_pairs(tmp_path):
    """The whole path through a fresh interpreter started in an unrelated folder, as a
    supervisor would start it: the same koder.toml as from the repository root."""
    code = (
        "from ragplane.server.settings import Settings; from ragplane.server.shadow.config import "
        "discover_koder_toml, load_pairs; p = discover_koder_toml(Settings.load().koder_toml); "
        "print(p); print(sorted(load_pairs(p)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPLANE_")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    path, pairs = out.stdout.splitlines()
    assert Path(path).resolve() == (ROOT / "koder.toml").resolve() and "embeddings" in pairs
