"""The Ray Serve embedding backend (`embed_backend = "ray_serve"`) on a local Ray cluster
(2 CPUs, a small object store) with the real model: a real server answers Embed with the
in-process canonical's vectors and identity, and the dynamic batcher, the shadow and the
metrics work on top of it unchanged; a server that starts its own Ray stops it at exit,
and an unreachable Ray stops the start with a message. `make test-ray`."""

from __future__ import annotations

import logging
import shutil
import socket
import threading

import grpc
import numpy as np
import psutil
import pytest

from ragplane.server.ray_start import init_ray, shutdown_ray
from ragplane.testkit.harness import InProcessServer, SubprocessServer
from ragplane.testkit.texts import sentences, topic_passages
from ragplane.v1 import admin_pb2, embed_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.timeout(600)]

# short sentences and long passages (past the shipped tokenizer's 128, where truncation
# must match)
TEXTS = [*sentences()[:48], *topic_passages(max_words=220, min_words=150)[:16]]

KODER = """
[self_hosted.embeddings]
canonical = "sentence-transformers"
shadow = "sentence-transformers"
status = "shadow-active"
sample_rate = 1.0
timing_rate = 1.0
"""


def test_close_stops_the_ray_it_started(tmp_path):
    """In-process, before the module's cluster exists: the server starts Ray for its
    deployment, and closing the server (no process exit to rely on) stops it."""
    import ray

    assert not ray.is_initialized(), "runs before the module's cluster fixture"
    srv = InProcessServer(tmp_path / "data", embed_backend="ray_serve", ray_address="local")
    try:
        assert srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["a b"])).embedder == "fake@1"
        assert ray.is_initialized()
        ray_procs = [p for p in psutil.Process().children(recursive=True) if p.name() == "raylet"]
        assert ray_procs
    finally:
        srv.stop()
    assert not ray.is_initialized()
    _, alive = psutil.wait_procs(ray_procs, timeout=60)
    assert not alive


@pytest.fixture(scope="module")
def ray_cluster():
    import ray
    from ray import serve

    # a head in a fresh interpreter: this process holds gRPC threads (ray_start.py says why)
    init_ray(
        ray,
        "local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=300 << 20,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    yield
    serve.shutdown()
    shutdown_ray(ray)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ray_cluster, st_model):
    """A server whose canonical (onnx, the CPU's `auto`) runs as a Ray Serve deployment,
    with torch sentence-transformers in this process as its shadow."""
    root = tmp_path_factory.mktemp("ray-serve")
    koder = root / "koder.toml"
    koder.write_text(KODER)
    srv = InProcessServer(
        root / "data",
        embedder_name="onnx",
        embed_backend="ray_serve",
        koder_toml=str(koder),
        shadow_embedders={"embeddings": st_model},
        # long enough that concurrent callers reliably meet in one pass
        batch_max_wait_ms=50.0,
    )
    yield srv
    srv.stop()


def test_replicas_that_cannot_load_stop_the_start(tmp_path, ray_cluster):
    """Runs before `served` takes the cluster's CPUs. Tokens count here, but replicas have
    no weights: the start fails with the reason, and leaves no app behind."""
    from ray import serve

    from ragplane.core.errors import Unavailable
    from ragplane.server.embedding.model_files import default_model_dir

    broken = tmp_path / "model"
    broken.mkdir()
    shutil.copy(default_model_dir() / "tokenizer.json", broken)
    with pytest.raises(Unavailable, match="did not start: .*has no model.safetensors"):
        InProcessServer(
            tmp_path / "data",
            embedder_name="onnx",
            model_dir=str(broken),
            embed_backend="ray_serve",
            ray_serve_app="broken",
        )
    assert "broken" not in serve.status().applications


def test_a_deployment_gone_is_unavailable_not_internal(tmp_path, ray_cluster):
    from ray import serve

    srv = InProcessServer(
        tmp_path / "data", embed_backend="ray_serve", ray_serve_app="gone", ray_serve_max_replicas=1
    )
    try:
        srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["a b"]))
        serve.delete("gone")  # an operator, or a lost cluster
        with pytest.raises(grpc.RpcError) as exc:
            srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["a b"]))
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the Ray Serve embedder (gone) did not answer" in exc.value.details()
    finally:
        srv.stop()


def vectors(reply) -> np.ndarray:
    return np.array([v.values for v in reply.vectors], dtype=np.float32)


def test_embed_equals_the_in_process_canonical(served, onnx_model):
    r = served.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=TEXTS))
    assert r.embedder == onnx_model.identity and r.model == onnx_model.model
    assert r.dim == onnx_model.dim
    assert list(r.token_counts) == onnx_model.count_tokens(TEXTS)
    assert max(r.token_counts) > 128  # the long passages are past the shipped truncation
    cos = (vectors(r) * onnx_model.embed(TEXTS)).sum(axis=1)
    assert cos.min() >= 0.9999, f"min cosine {cos.min()}"
    info = served.stubs.embed.Info(embed_pb2.InfoRequest())
    assert info.embedder == onnx_model.identity and info.device.startswith("ray-serve:")


def test_concurrent_requests_share_passes(served, onnx_model):
    embedding = served.runtime.embedding
    stats = embedding.batcher_for(embedding.canonical).stats
    passes, requests = stats.passes, stats.requests
    callers = 16
    texts = list(TEXTS[:callers])
    got: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(callers)

    def call(i: int) -> None:
        barrier.wait()
        got[i] = vectors(served.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=[texts[i]])))[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.requests - requests == callers
    assert stats.passes - passes < callers  # some callers shared a forward pass
    cos = (np.stack([got[i] for i in range(callers)]) * onnx_model.embed(texts)).sum(axis=1)
    assert cos.min() >= 0.9999


def test_shadow_samples_on_top(served, st_model):
    served.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=TEXTS[:8]))
    served.runtime.shadow.drain()
    case = served.stubs.admin.ShadowStatus(admin_pb2.ShadowStatusRequest()).cases[0]
    assert (
        case.status == "shadow-active"
        and case.serving == served.runtime.embedding.canonical.identity
    )
    rel = case.releases[0]
    assert rel.shadow == st_model.identity and rel.samples >= 8 and rel.errors == 0
    # torch beside ONNX Runtime over Ray: the same model, so they agree
    assert rel.cosine_min >= 0.9999
    assert rel.timed_batches > 0  # the canonical was timed through the deployment


def test_metrics_count_passes_and_rpcs(served):
    registry = served.runtime.metrics.registry

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels or None) or 0.0

    rpcs = sample("ragplane_requests_total", method="EmbedService/Embed", code="OK")
    texts = sample("ragplane_embed_batch_texts_sum")
    served.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=TEXTS[:5]))
    assert sample("ragplane_requests_total", method="EmbedService/Embed", code="OK") == rpcs + 1
    assert sample("ragplane_embed_batch_texts_sum") == texts + 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_stops_the_start(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    srv = SubprocessServer(
        tmp_path / "data", "--set", "embed_backend=ray_serve", "--set", f"ray_address={address}"
    )
    with pytest.raises(RuntimeError) as exc:
        srv.start(timeout=120)
    assert "server exited with 2" in str(exc.value)
    assert f"cannot reach Ray at {address}" in str(exc.value)


def test_a_local_ray_it_started_stops_with_it(tmp_path):
    # the fake canonical keeps the replica cheap; what is tested is the Ray the server owns
    srv = SubprocessServer(tmp_path / "data", "--set", "embed_backend=ray_serve")
    srv.start(timeout=300)
    try:
        r = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["hello ray serve"]))
        assert r.embedder == "fake@1"
        info = srv.stubs.embed.Info(embed_pb2.InfoRequest())
        assert info.device == "ray-serve:cpu"
        ray_procs = psutil.Process(srv.proc.pid).children(recursive=True)
        names = {p.name() for p in ray_procs}
        assert {"gcs_server", "raylet"} <= names, names
    finally:
        rc = srv.terminate(timeout=120)
    assert rc == 0
    _, alive = psutil.wait_procs(ray_procs, timeout=60)
    assert not alive, [p.name() for p in alive]
