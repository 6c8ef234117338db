"""The bulk pipeline on a Ray cluster (Ray Data): the one module of `server/bulk` that imports Ray.

Reading runs as Ray Data read tasks (one per file, through `RowsDatasource`), embedding in
a pool of actors that each load the canonical embedder once (`EmbedBatch`): one GPU each
where the cluster has GPUs, else one CPU each, so that read tasks keep a CPU to run on.
The driver iterates the embedded batches in input order and writes them itself, so the
workers never need to reach the ragplane server. The documents of a folder are read by
plain Ray tasks, one per file (`read_documents`); the server embeds those itself.

Why a datasource of our own rather than `read_json` / `read_csv` / `read_parquet`: those
neither say which line a row came from nor survive one malformed line (the whole read
fails), and every bad row must be reported by file and line.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.data import ActorPoolStrategy, DataContext
from ray.data.datasource import FileBasedDatasource

from ragplane.core import errors
from ragplane.core.errors import InvalidArgument, RagplaneError, Unavailable
from ragplane.server.bulk import files, rows
from ragplane.server.bulk.embed import VECTOR, EmbedBatch, EmbedderSpec
from ragplane.server.ray_start import init_ray, shutdown_ray

# A local instance's shared-memory store: enough for the pipeline's few batches in flight
# (backpressure keeps it so), small enough for a container's /dev/shm.
LOCAL_OBJECT_STORE_MB = 512
_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RAGPLANE_CACHE_DIR")


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster a pipeline runs on, for the pool size and the summary."""

    address: str
    nodes: int
    cpus: float
    gpus: float

    def describe(self) -> str:
        gpus = f", {self.gpus:g} GPUs" if self.gpus else ""
        where = "a local Ray instance" if self.address == "local" else f"Ray at {self.address}"
        return f"{where} ({self.nodes} node{'s' * (self.nodes != 1)}, {self.cpus:g} CPUs{gpus})"


def check_target(target: str) -> str:
    """`local`, `auto`, or a cluster address (`host:port`, `ray://host:port`)."""
    target = target.strip()
    if not target or any(c.isspace() for c in target):
        raise InvalidArgument(
            f"Ray target {target!r} is not valid; use local, auto or a cluster address "
            "such as 10.0.0.5:6379 or ray://head:10001"
        )
    return target


@contextlib.contextmanager
def session(target: str, *, object_store_mb: int = LOCAL_OBJECT_STORE_MB) -> Iterator[Cluster]:
    """Connected to Ray for the block: `local` starts an instance on this machine (stopped
    afterwards), `auto` joins the one running here, anything else is an address. A process
    already connected (a test, a notebook) keeps its connection and it is not closed."""
    target = check_target(target)
    started = not ray.is_initialized()
    if started:
        env = {k: os.environ[k] for k in _OFFLINE if k in os.environ}
        options: dict[str, Any] = {
            "logging_level": logging.WARNING,
            "log_to_driver": False,
            "runtime_env": {"env_vars": env},
        }
        if target == "local":
            options.update(
                num_cpus=os.cpu_count(), include_dashboard=False,
                object_store_memory=object_store_mb << 20,
            )
        else:
            options["address"] = target
        _init(target, options)
    try:
        yield _cluster(target)
    finally:
        if started:
            shutdown_ray(ray)


def _init(target: str, options: dict[str, Any]) -> None:
    try:
        init_ray(ray, target, **options)
    except ConnectionError as exc:
        raise Unavailable(f"cannot connect to Ray at {target}: {exc}") from None


def _cluster(target: str) -> Cluster:
    res = ray.cluster_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return Cluster(target, nodes, float(res.get("CPU", 0)), float(res.get("GPU", 0)))


def _quiet_context() -> DataContext:
    ctx = DataContext.get_current()
    # Input order out: the last of two rows with one id wins, as in a clean re-run.
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False  # the caller draws its own
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # it warns that the bars are off, which is our choice, not the user's problem
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    ctx.target_max_block_size = max(ctx.target_max_block_size or 0, 1 << 20)
    return ctx


def pool(cluster: Cluster, spec: EmbedderSpec, actors: int = 0) -> tuple[int, dict, EmbedderSpec]:
    """(actors, their resources, the spec they load): one per GPU where there are GPUs, else
    one per CPU but one per node (left to read tasks). A CPU actor reserves one CPU, but
    computes with its share of its node's cores: read tasks need little."""
    if cluster.gpus >= 1:
        n = actors or int(cluster.gpus)
        return n, {"num_cpus": 1, "num_gpus": 1}, replace(spec, device="cuda")
    n = actors or max(1, int(cluster.cpus) - cluster.nodes)
    per_node = -(-n // max(1, cluster.nodes))
    threads = max(1, int(cluster.cpus / max(1, cluster.nodes)) // per_node)
    return n, {"num_cpus": 1}, replace(spec, threads=threads, device="cpu")


def _embedded(ds: Any, spec: EmbedderSpec, cluster: Cluster, batch_rows: int, actors: int):
    n, resources, spec = pool(cluster, spec, actors)
    return ds.map_batches(
        EmbedBatch,
        fn_constructor_args=(spec,),
        batch_size=batch_rows,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=n),
        **resources,
    )


class RowsDatasource(FileBasedDatasource):
    """Ray Data read tasks over ingest files: `rows.chunks` as Arrow blocks, one file per
    task, every row with its file and line."""

    def __init__(self, paths: list[str], *, forced_format: str, chunk_rows: int) -> None:
        super().__init__(paths)
        self._forced = forced_format
        self._chunk_rows = chunk_rows

    def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
        if rows.format_of(path, self._forced) == "parquet":  # Parquet needs random access
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        fmt = rows.format_of(path, self._forced)
        for chunk in rows.chunks(f, path, fmt, self._chunk_rows):
            yield pa.table(
                {k: pa.array(v.tolist(), type=pa.int64() if k == rows.LINE else pa.string())
                 for k, v in chunk.items()}
            )


def ingest_batches(
    files: list[str], spec: EmbedderSpec, cluster: Cluster, *, batch_rows: int,
    forced_format: str = "", actors: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Every row of `files` in input order, embedded on the cluster, as column batches.
    Read tasks may run on any node, so on a cluster of several nodes local paths must be
    on storage they share (or be s3:// / gs:// URIs)."""
    _quiet_context()
    ds = ray.data.read_datasource(
        RowsDatasource(files, forced_format=forced_format, chunk_rows=batch_rows)
    )
    ds = _embedded(ds, spec, cluster, batch_rows, actors)
    yield from _surfaced(
        ds.iter_batches(batch_size=batch_rows, batch_format="numpy", prefetch_batches=2)
    )


def read_documents(root: str, paths: list[str], cluster: Cluster) -> Iterator[files.Doc]:
    """The documents `paths` (relative to `root`), each read and parsed by a Ray task of one
    CPU, in the order given, with up to two tasks per CPU of the cluster in flight. As with
    rows, `root` must be on storage that every node shares. Plain tasks rather than Ray
    Data: a document is one object, and the driver needs them back one by one, in order."""
    root = os.path.abspath(root)
    read = ray.remote(num_cpus=1)(files.read)
    window = max(2, 2 * int(cluster.cpus))

    def in_order() -> Iterator[files.Doc]:
        pending: deque[Any] = deque()
        try:
            for rel in paths:
                pending.append(read.remote(root, rel))
                if len(pending) >= window:
                    yield ray.get(pending.popleft())
            while pending:
                yield ray.get(pending.popleft())
        finally:
            for ref in pending:  # a run ended early leaves no work behind
                ray.cancel(ref)

    yield from _surfaced(in_order())


def _surfaced(batches: Iterator[Any]) -> Iterator[Any]:
    """`batches`, with our errors raised in a worker (a bad file, an embedder of another
    version) raised here as themselves rather than wrapped in Ray's."""
    try:
        yield from batches
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RagplaneError):
            raise cause from None
        # an actor whose constructor failed carries only the text; ours end it
        for line in reversed(str(exc).splitlines()):
            kind, _, message = line.partition(": ")
            if kind.startswith("ragplane.core.errors.") and message:
                error = getattr(errors, kind.rpartition(".")[2], None)
                if isinstance(error, type) and issubclass(error, RagplaneError):
                    raise error(message) from None
        raise Unavailable(f"the Ray pipeline failed: {str(exc).splitlines()[0]}") from exc


def embed_texts(
    batches: Iterable[list[str]], spec: EmbedderSpec, cluster: Cluster, *,
    batch_rows: int = 256, actors: int = 0,
) -> Iterator[np.ndarray]:
    """One [len(b), dim] float32 array per input batch `b`, in order, embedded on the
    cluster. The texts are handed to Ray up front (a rebuild reads them from its store)."""
    sizes: deque[int] = deque()
    tables = []
    for b in batches:
        if b:
            sizes.append(len(b))
            tables.append(pa.table({rows.TEXT: pa.array(b, type=pa.string())}))
    if not tables:
        return
    _quiet_context()
    ds = _embedded(ray.data.from_arrow(tables), spec, cluster, batch_rows, actors)
    held: list[np.ndarray] = []
    count = 0
    batches = ds.iter_batches(batch_size=batch_rows, batch_format="numpy", prefetch_batches=2)
    for out in _surfaced(batches):
        held.append(np.asarray(out[VECTOR], dtype=np.float32))
        count += len(held[-1])
        while sizes and count >= sizes[0]:
            flat = np.concatenate(held)
            yield flat[: sizes[0]]
            count -= sizes[0]
            held = [flat[sizes.popleft():]]
