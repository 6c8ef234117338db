"""The canonical embedder as a Ray Serve deployment: online embedding replicas past one
machine, behind our own gRPC front (`embed_backend = "ray_serve"`).

`RayServeEmbedder` is an `Embedder` like the others, so the dynamic batcher, the shadow
and the metrics sit on top of it unchanged; only the forward pass moves. Each replica
(`EmbedderReplica`) loads the canonical embedder once, on a GPU where the cluster has one.
Serve scales the replicas between `min_replicas` and `max_replicas` on the requests in
flight; to give it requests to count and spread, one batcher pass is cut into up to
`max_replicas` length-sorted chunks that run at once. Serve's HTTP proxy stays off: the
server calls the deployment through a `DeploymentHandle`.

The vectors are the canonical's, so this embedder reports the canonical's own name and
version (read from a replica at start): collections and the shadow's evidence cannot
tell the two backends apart, as they should not. Ray is imported only here, and only when
this backend is chosen.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragplane.core.errors import Unavailable
from ragplane.server.embedding.base import Embedder, Identified, l2_normalize
from ragplane.server.ray_start import init_ray, shutdown_ray

log = logging.getLogger(__name__)

# Texts per chunk at least: below this a chunk's fixed cost (a Ray round trip, ~2-5 ms
# here) outweighs what a second replica saves; 16 is also ONNX Runtime's CPU sub-batch.
MIN_CHUNK_TEXTS = 16
# A pass that has not come back by then is treated as a lost cluster (UNAVAILABLE), not
# waited on forever: it covers a cold replica start (model load) with room to spare.
RESULT_TIMEOUT_S = 120.0
# A local Ray instance's shared-memory store: texts in, vectors out, a few passes in
# flight; small enough for a container's /dev/shm.
LOCAL_OBJECT_STORE_MB = 512
_FORWARD_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RAGPLANE_CACHE_DIR")


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """What each replica loads; small and picklable, it travels to the Ray workers."""

    embedder: str  # the canonical's configuration name (auto, onnx, sentence-transformers...)
    model_dir: str = ""
    device: str = "auto"
    max_seq_length: int = 256
    half: bool = True
    # ONNX Runtime's intra-op threads on a CPU replica: its share of the node's cores, so
    # replicas side by side do not fight over them. 0 = ONNX Runtime's default.
    threads: int = 0

    def load(self) -> Embedder:
        from ragplane.server.embedding import load_embedder

        if self.threads and self.device == "cpu" and self.embedder in ("auto", "onnx"):
            from ragplane.server.embedding.onnx import OnnxEmbedder

            return OnnxEmbedder(self.model_dir or None, "cpu", self.max_seq_length, self.threads)
        return load_embedder(
            self.embedder,
            model_dir=self.model_dir,
            device=self.device,
            max_seq_length=self.max_seq_length,
            half=self.half,
        )


class EmbedderReplica:
    """One Serve replica: the canonical embedder, loaded once in the constructor."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self._embedder = spec.load()

    def describe(self) -> dict[str, Any]:
        e = self._embedder
        return {
            "name": e.name,
            "version": e.version,
            "family": getattr(e, "family", e.name),
            "model": e.model,
            "dim": int(e.dim),
            "max_seq_length": int(e.max_seq_length),
            "device": e.device,
        }

    def embed(self, texts: list[str], normalize: bool) -> np.ndarray:
        return self._embedder.embed(texts, normalize=normalize)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """Where and how the deployment runs (the `ray_*` settings)."""

    address: str = ""  # "" or local: start Ray here; auto: the cluster of this machine; host:port
    app: str = "ragplane-embedder"
    min_replicas: int = 1
    max_replicas: int = 2
    replica_cpus: int = 1
    gpu: bool = True  # one GPU per replica where the cluster has GPUs


class RayServeEmbedder(Identified):
    """The canonical embedder, answered by Ray Serve replicas. Token counting stays local
    (the model's tokenizer, no model), so limits and the batcher's budget cost no round
    trip. Close it (or use it as a context manager) to delete the deployment and stop a
    Ray instance it started."""

    def __init__(self, spec: ReplicaSpec, options: ServeOptions) -> None:
        import ray
        from ray.serve.exceptions import RayServeException

        # A lost cluster, a dead replica, a timeout: UNAVAILABLE. A replica's own error
        # (RayTaskError) stays what it is.
        self._ray_errors = (ray.exceptions.RayError, RayServeException, TimeoutError)
        self._task_error = ray.exceptions.RayTaskError
        self.options = options
        self._counter = _token_counter(spec)
        self._started_ray = _connect(options.address)
        self._closed = False
        try:
            self._handle, info = _deploy(spec, options)
        except BaseException:
            self.close()  # what a failed deploy left on the cluster goes too
            raise
        self.name = info["name"]
        self.version = info["version"]
        self.family = info["family"]
        self.model = info["model"]
        self.dim = info["dim"]
        self.max_seq_length = info["max_seq_length"]
        self.device = f"ray-serve:{info['device']}"
        log.info(
            "embedding on Ray Serve: app %s, %s on %s, %d-%d replicas",
            options.app,
            self.identity,
            info["device"],
            options.min_replicas,
            options.max_replicas,
        )

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        # Similar lengths per chunk keep each replica's padding small.
        order = sorted(range(n), key=lambda i: len(texts[i]))
        parts = max(1, min(self.options.max_replicas, n // MIN_CHUNK_TEXTS))
        chunks = [c for c in np.array_split(np.asarray(order), parts) if len(c)]
        try:
            pending = [self._handle.embed.remote([texts[i] for i in c], False) for c in chunks]
            for c, response in zip(chunks, pending, strict=True):
                out[c] = response.result(timeout_s=RESULT_TIMEOUT_S)
        except self._ray_errors as exc:
            if isinstance(exc, self._task_error):
                raise
            raise Unavailable(
                f"the Ray Serve embedder ({self.options.app}) did not answer: "
                f"{type(exc).__name__}: {exc}; retry, and check the Ray cluster"
            ) from exc
        return l2_normalize(out) if normalize else out

    @property
    def hf_tokenizer(self) -> Any:
        return getattr(self._counter, "hf_tokenizer", None)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._counter.count_tokens(texts)

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return self._counter.count_tokens_untruncated(texts)

    def close(self) -> None:
        """Delete the deployment; stop Ray if this embedder started it. Idempotent."""
        import ray
        from ray import serve

        if self._closed:
            return
        self._closed = True
        if self._started_ray:  # the whole instance goes, the app with it
            serve.shutdown()
            shutdown_ray(ray)
            return
        try:
            serve.delete(self.options.app)
        except Exception as exc:  # the cluster may be gone already; nothing left to free
            log.warning("could not delete Ray Serve app %s: %s", self.options.app, exc)

    def __enter__(self) -> RayServeEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Tokens:
    """count_tokens / count_tokens_untruncated without a model."""

    def __init__(self, counter: Any) -> None:
        self._c = counter
        self.hf_tokenizer = getattr(counter, "tokenizer", None)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._c.truncated(texts)

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return self._c.untruncated(texts)


def _token_counter(spec: ReplicaSpec) -> Any:
    if spec.embedder == "fake":  # model-free: it counts words, not tokenizer tokens
        from ragplane.server.embedding.fake import FakeEmbedder

        return FakeEmbedder(max_seq_length=spec.max_seq_length)
    from pathlib import Path

    from ragplane.server.embedding.model_files import default_model_dir
    from ragplane.server.embedding.tokens import TokenCounter

    path = Path(spec.model_dir) if spec.model_dir else default_model_dir()
    if not (path / "tokenizer.json").exists():
        raise ValueError(f"{path} has no tokenizer.json to count tokens with")
    return _Tokens(TokenCounter(path, spec.max_seq_length))


def _connect(address: str) -> bool:
    """Connect this process to Ray; True when it started a local instance (ours to stop).
    A process already connected (a test, an embedding app) keeps its connection."""
    import ray

    if ray.is_initialized():
        log.info("Ray Serve embedder: using this process's Ray connection")
        return False
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    address = address.strip() or "local"
    if address == "local":
        options.update(include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_MB << 20)
    else:
        _check_reachable(address)
    # ray.init makes SIGTERM exit the process at once; the server's own handler, which
    # drains calls and then closes this embedder (and Ray), must stay the one that runs.
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        init_ray(ray, address, address=address, **options)
    except ConnectionError as exc:
        raise Unavailable(_unreachable(address, str(exc))) from None
    finally:
        if threading.current_thread() is threading.main_thread() and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return address == "local"


def _check_reachable(address: str) -> None:
    """Ray waits for an unreachable head for many minutes; a TCP connect says it in
    seconds. `auto` is left to Ray, which fails at once when no local cluster runs."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise Unavailable(
            f"ray_address {address!r} is not an address; use host:port (the head's GCS, "
            "default port 6379), ray://host:10001, auto or local"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise Unavailable(_unreachable(address, exc.strerror or str(exc))) from None


def _unreachable(address: str, why: str) -> str:
    return (
        f"cannot reach Ray at {address} ({why}); start the cluster (`ray start --head` on "
        "its head node), set ray_address=local to run Ray on this machine, or set "
        "embed_backend=in_process"
    )


def _deploy(spec: ReplicaSpec, options: ServeOptions) -> tuple[Any, dict[str, Any]]:
    """Run the app (HTTP proxy off) and read the canonical's identity from a replica."""
    import ray
    from ray import serve

    gpu = options.gpu and ray.cluster_resources().get("GPU", 0) >= 1
    if not gpu:
        # Without a GPU of its own a replica must not pick one up by chance, and it runs on
        # as many threads as the CPUs it reserved.
        spec = dataclasses.replace(spec, device="cpu", threads=options.replica_cpus)
    env = {k: os.environ[k] for k in _FORWARD_ENV if k in os.environ}
    deployment = serve.deployment(
        EmbedderReplica,
        name="Embedder",
        ray_actor_options={
            "num_cpus": options.replica_cpus,
            "num_gpus": 1 if gpu else 0,
            "runtime_env": {"env_vars": env},
        },
        # One pass chunk at a time per replica; the rest wait at the handle, where Serve
        # counts them to scale out.
        max_ongoing_requests=1,
        autoscaling_config={
            "min_replicas": options.min_replicas,
            "max_replicas": options.max_replicas,
            "target_ongoing_requests": 1,
        },
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    try:
        serve.start(proxy_location="Disabled")
        handle = serve.run(deployment.bind(spec), name=options.app, route_prefix=None)
        info = handle.describe.remote().result(timeout_s=RESULT_TIMEOUT_S)
    except (RuntimeError, ray.exceptions.RayError, TimeoutError) as exc:
        raise Unavailable(
            f"the Ray Serve embedder ({options.app}) did not start: "
            f"{_why_not_started(options.app) or exc}; more in the Ray logs "
            "(session_latest/logs under Ray's temp dir)"
        ) from exc
    return handle, info


def _why_not_started(app: str) -> str:
    """The last line of a failed replica's traceback (the replica's own error), which
    serve.run's exception leaves out; empty when Serve does not say."""
    from ray import serve

    try:
        status = serve.status().applications.get(app)
    except Exception:  # the cluster may be what failed; the caller has serve.run's error
        return ""
    for deployment in status.deployments.values() if status else ():
        lines = [line.strip() for line in (deployment.message or "").splitlines()]
        if lines := [line for line in lines if line]:
            return lines[-1]
    return ""
