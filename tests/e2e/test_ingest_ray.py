"""Bulk work on a local Ray cluster (2 CPUs, a small object store) with the real model:
`ragplane ingest --ray` over JSONL, CSV and Parquet of real text equals the in-process
run, an ingest killed with SIGKILL midway and run again equals a clean run, and a rebuild
re-embeds on Ray when the server's ray_address is set. `make test-ray`."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from ragplane.server.cli import app
from ragplane.server.ray_start import init_ray, shutdown_ray
from ragplane.testkit.harness import ROOT, InProcessServer
from ragplane.testkit.texts import sentences, topic_passages
from ragplane.v1 import admin_pb2, common_pb2, embed_pb2, index_pb2

from .test_ingest import contents, flat, write_inputs

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.timeout(600)]

# short sentences and long passages (past 128 tokens, where truncation must match)
TEXTS = [*sentences()[:240], *topic_passages()[:60]]


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    # a head in a fresh interpreter: this process holds gRPC threads (ray_start.py says why)
    init_ray(ray, "local", num_cpus=2, include_dashboard=False, object_store_memory=300 << 20,
             logging_level=logging.WARNING, log_to_driver=False)
    yield
    shutdown_ray(ray)


@pytest.fixture(scope="module")
def real(tmp_path_factory, ray_cluster):
    """A server with the canonical embedder whose rebuilds re-embed on Ray, and the input
    files, ingested once in this process as the reference ("clean")."""
    root = tmp_path_factory.mktemp("ray-ingest")
    srv = InProcessServer(root / "data", embedder_name="onnx", ray_address="local")
    ids = write_inputs(root / "in", TEXTS)
    out = ingest(srv, root / "in", "clean", "--create")
    assert out.exit_code == 0, out.output
    srv.inputs, srv.ids = root / "in", ids
    srv.clean = contents(srv.stubs, "clean", ids)
    yield srv
    srv.stop()


def ingest(srv, path, collection: str, *args: str):
    return CliRunner().invoke(
        app, ["ingest", str(path), "-c", collection, "--addr", f"127.0.0.1:{srv.port}", *args],
        catch_exceptions=False,
    )


def count(srv, name: str) -> int:
    try:
        return srv.stubs.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name=name)).count
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return 0
        raise


def assert_same_collection(got: dict, want: dict, min_cosine: float) -> None:
    assert sorted(got) == sorted(want)
    assert {i: v[:2] for i, v in got.items()} == {i: v[:2] for i, v in want.items()}
    cos = [float(got[i][2] @ want[i][2]) for i in want]
    assert min(cos) >= min_cosine, f"min cosine {min(cos)}"


def test_ray_ingest_of_three_formats_equals_in_process(real):
    out = ingest(real, real.inputs, "onray", "--create", "--ray", "local", "--batch-size", "64")
    assert out.exit_code == 0, out.output
    text = flat(out.output)
    assert "a local Ray instance (1 node, 2 CPUs), 1 embedding actor of 1 CPU" in text
    assert f"rows read {len(real.ids) + 2}" in text and f"upserted {len(real.ids)}" in text
    assert "a.jsonl:4: no text (id 'j-bad')" in text and "a.jsonl:5: not valid JSON" in text
    got = contents(real.stubs, "onray", real.ids)
    assert_same_collection(got, real.clean, min_cosine=0.99999)
    # and each vector is the server's own Embed of the text
    theirs = real.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=TEXTS)).vectors
    cos = [float(got[i][2] @ np.asarray(v.values)) for i, v in zip(real.ids, theirs, strict=True)]
    assert min(cos) >= 0.9999


def test_ingest_killed_midway_then_run_again_equals_a_clean_run(real, tmp_path):
    cmd = [sys.executable, "-m", "ragplane.server.cli", "ingest", str(real.inputs), "-c", "killed",
           "--create", "--ray", "local", "--batch-size", "8", "--addr", f"127.0.0.1:{real.port}"]
    log = tmp_path / "ingest.log"
    with open(log, "wb") as out:
        # its own session, so that what its local Ray leaves behind can be ended with it
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while (at_kill := count(real, "killed")) < 16:
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the ingest wrote nothing in 240 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        with_children_gone(proc)
    assert 0 < at_kill < len(real.ids), "the kill did not land midway"

    out = ingest(real, real.inputs, "killed", "--ray", "local", "--batch-size", "64")
    assert out.exit_code == 0, out.output
    assert count(real, "killed") == len(real.ids)
    assert_same_collection(contents(real.stubs, "killed", real.ids), real.clean,
                           min_cosine=0.9999)


def with_children_gone(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session it led, by its id
    except ProcessLookupError:
        pass


def test_rebuild_with_reembed_runs_its_embedding_on_ray(real):
    texts = TEXTS[:120]
    real.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="rb"))
    real.stubs.index.Upsert(index_pb2.UpsertRequest(collection="rb", items=[
        common_pb2.Item(id=f"r{i}", text=t) for i, t in enumerate(texts)]))
    reports = list(real.stubs.admin.Rebuild(
        admin_pb2.RebuildRequest(collection="rb", reembed=True)))
    embedding = [p for p in reports if p.phase == "embedding" and p.done]
    assert embedding and embedding[-1].done == len(texts)
    assert all("on a local Ray instance (1 node, 2 CPUs)" in p.message for p in embedding)
    assert reports[-1].phase == "swapped"
    info = real.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="rb"))
    assert info.generation == 2 and info.count == len(texts)
    got = contents(real.stubs, "rb", [f"r{i}" for i in range(len(texts))])
    theirs = real.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts)).vectors
    cos = [float(got[f"r{i}"][2] @ np.asarray(v.values)) for i, v in enumerate(theirs)]
    assert min(cos) >= 0.9999


def test_a_ray_node_with_another_embedder_version_refuses_before_writing(real):
    from ragplane.core.errors import FailedPrecondition
    from ragplane.server.bulk.embed import EmbedderSpec
    from ragplane.server.bulk.pipeline import Options
    from ragplane.server.bulk.pipeline import ingest as run

    written: list = []

    class Writer:
        def upsert(self, records) -> None:
            written.extend(records)

    with pytest.raises(FailedPrecondition, match=r"must come from onnx@0\.0\.0, but this "
                       r"machine has onnx@"):
        run([str(real.inputs / "a.jsonl")], EmbedderSpec("onnx@0.0.0"), Writer(),
            Options(ray="local"))
    assert written == []
