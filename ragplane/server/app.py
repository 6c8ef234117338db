"""Assembly: `build_runtime(settings)` wires the domain; `create_server(settings)` returns
`(server, port, runtime)` with health and reflection registered (and the OpenAI-compatible
HTTP API serving when `http_port` is set); `serve()` runs until SIGTERM/SIGINT and stops
gracefully (drains in-flight calls of both for `grace_seconds`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragplane.core import cpus
from ragplane.core.errors import InvalidArgument
from ragplane.core.serverdb import ServerDb, Tables
from ragplane.index import CollectionInfo
from ragplane.index.backend import Backend, Store, StoreConfig, open_store
from ragplane.index.gpu import faiss_gpu_available
from ragplane.server import __version__, auth
from ragplane.server.admin import AdminOps
from ragplane.server.admission import Admission, CountingExecutor
from ragplane.server.auth import DEFAULT_TENANT, SCOPES, KeyStore
from ragplane.server.collections import CollectionService
from ragplane.server.consistency import Gate
from ragplane.server.embedders import canonical, cluster_reembed
from ragplane.server.embedding import Embedder, load_embedder
from ragplane.server.embedding.service import EmbeddingService
from ragplane.server.embedding.warmup import largest_pass, warm_up
from ragplane.server.health_state import HealthState
from ragplane.server.http_server import HttpServer, serve_http
from ragplane.server.interceptors import ServerInterceptor
from ragplane.server.memory import MemoryService
from ragplane.server.metrics import Metrics
from ragplane.server.servicers.admin import AdminServicer
from ragplane.server.servicers.embed import EmbedServicer
from ragplane.server.servicers.index import IndexServicer
from ragplane.server.servicers.memory import MemoryServicer
from ragplane.server.servicers.search import SearchServicer
from ragplane.server.settings import Settings
from ragplane.server.shadow import evidence
from ragplane.server.shadow.config import PairConfig, discover_koder_toml, load_pairs
from ragplane.server.shadow.evidence import EvidenceStore
from ragplane.server.shadow.manager import ShadowManager
from ragplane.server.shadow.releases import ReleaseHistory, history_beside
from ragplane.server.shadow.signing import Signer
from ragplane.server.shadow.types import CaseStatus
from ragplane.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    embed_pb2,
    embed_pb2_grpc,
    index_pb2,
    index_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    search_pb2,
    search_pb2_grpc,
)

log = logging.getLogger("ragplane")


@dataclass
class Runtime:
    """Everything the servicers share; closed in reverse order of creation."""

    settings: Settings
    engine: Store
    embedding: EmbeddingService
    collections: CollectionService
    keys: KeyStore
    memory: MemoryService
    admin: AdminOps
    backend: Backend  # the store, chosen once at start; `engine` is its `store`
    started_at: float = field(default_factory=time.time)
    shadow: ShadowManager | None = None
    metrics: Metrics = field(default_factory=Metrics)
    metrics_port: int = 0
    http: HttpServer | None = None  # the OpenAI-compatible API, when http_port is set
    health: HealthState | None = None  # set by create_server
    # what to close, in reverse order of creation; idempotent
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self.closing.close()


def build_runtime(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    clock: Callable[[], float] = time.time,
    shadow_embedders: dict[str, Embedder] | None = None,
) -> Runtime:
    """Every service of a server, ready to serve. What was opened is closed again when
    building fails part way (the data directory's lock among it)."""
    with contextlib.ExitStack() as stack:
        runtime = _assemble(stack, settings, embedder, clock, shadow_embedders)
        runtime.closing = stack.pop_all()
        return runtime


def _assemble(
    stack: contextlib.ExitStack,
    settings: Settings,
    embedder: Embedder | None,
    clock: Callable[[], float],
    shadow_embedders: dict[str, Embedder] | None,
) -> Runtime:
    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if embedder is None:
        embedder = canonical(stack, settings)
    koder_toml = discover_koder_toml(settings.koder_toml)
    pairs = load_pairs(koder_toml) if koder_toml else {}
    metrics = Metrics()
    embedding = EmbeddingService(
        embedder,
        use_cases=list(pairs),
        on_pass=metrics.observe_pass,
        max_batch_texts=settings.max_batch_texts,
        max_text_bytes=settings.max_text_bytes,
        batch_max_tokens=settings.batch_max_tokens,
        batch_max_wait_s=settings.batch_max_wait_ms / 1000.0,
        queue_texts=settings.embed_queue_texts,
    )
    stack.callback(embedding.close)
    backend = _open_backend(settings, data_dir)
    stack.callback(backend.close)
    engine = backend.store
    if backend.follower is not None:
        backend.follower.on_lag = metrics.observe_store_lag
    collections = CollectionService(
        engine, embedding, max_batch_items=settings.max_batch_texts,
        search_max_batch=settings.search_max_batch,
        search_coalesce_min_vectors=settings.search_coalesce_min_vectors,
        max_item_text_bytes=settings.max_item_text_bytes,
    )  # fmt: skip
    # the store keeps the keys and the shadow's state too (a shared one: the cluster's)
    keys = KeyStore(db=backend.server_db(auth.TABLES))
    stack.callback(keys.close)
    if bootstrap := settings.bootstrap_admin_key.get_secret_value():
        keys.ensure(bootstrap, DEFAULT_TENANT, SCOPES, "bootstrap admin key")
    memory = MemoryService(
        engine,
        embedding,
        dedup_threshold=settings.memory_dedup_threshold,
        half_life_seconds=settings.memory_half_life_seconds,
        clock=clock,
    )
    memory.sweep()  # memories that expired while the server was down
    memory.start_sweeper(settings.memory_sweep_seconds)
    stack.callback(memory.close)
    admin = AdminOps(
        engine, embedding, memory, keys, data_dir=data_dir, started_at=time.time(),
        cluster_reembed=cluster_reembed(settings),
    )
    runtime = Runtime(
        settings, engine, embedding, collections, keys, memory, admin, backend, metrics=metrics
    )
    shadow = _build_shadow(
        settings,
        pairs,
        embedder,
        shadow_embedders or {},
        data_dir,
        busy=lambda: embedding.queued_texts > 0,
        history=history_beside(koder_toml),
        server_db=backend.server_db,
    )
    if shadow is not None:
        for case in shadow.cases.values():
            embedding.register(case.shadow)
        embedding.shadow = shadow
        collections.set_compatibility(shadow.compatible)
        memory.set_compatibility(shadow.compatible)
        admin.shadow = shadow
        runtime.shadow = shadow
        stack.callback(shadow.close)
    _warm_up(settings, embedder, shadow)
    return runtime


def _warm_up(settings: Settings, canonical: Embedder, shadow: ShadowManager | None) -> None:
    """Every embedder at the largest pass its batcher can form, on as many threads as run
    it at once now. The canonical: its batcher, plus per shadow experiment the A/B/A timing
    thread or, after a flip, the experiment's worker (never both). A shadow: its experiment's
    worker or the timing thread, plus its batcher while it serves a case. A later flip adds
    that batcher; embedder_rs keeps one buffer set, written at load, and frees what larger
    or concurrent calls allocate, so it keeps no later peak."""
    embedders = {canonical.identity: canonical}
    at_once = {canonical.identity: 1}
    for case in shadow.cases.values() if shadow is not None else ():
        ident = case.shadow.identity
        embedders.setdefault(ident, case.shadow)
        at_once.setdefault(ident, 0)
        if case.experiment is not None:
            at_once[canonical.identity] += 1
            at_once[ident] += 1
        if case.serving == ident:
            at_once[ident] += 1
    texts = largest_pass(settings.batch_max_tokens, settings.max_seq_length)
    for ident, e in embedders.items():
        warm_up(e, texts=texts, parallel=max(1, at_once[ident]))


def _open_backend(settings: Settings, data_dir: Path) -> Backend:
    """The store `settings.store` names (`open_store`: the one place that chooses)."""
    use_gpu = settings.faiss_gpu != "off" and faiss_gpu_available()
    if settings.faiss_gpu == "on" and not use_gpu:
        raise InvalidArgument(
            "faiss_gpu=on but FAISS has no GPU support or sees no GPU; install the [gpu] "
            "extra (make install-gpu) on a CUDA machine, or set faiss_gpu=auto"
        )
    return open_store(StoreConfig(
        settings.store, data_dir, checkpoint_every=settings.checkpoint_every, use_gpu=use_gpu,
        integrity_check=settings.integrity_check, log_keep=settings.store_log_keep,
    ))


def _build_shadow(
    settings: Settings,
    pairs: dict[str, PairConfig],
    canonical: Embedder,
    given: dict[str, Embedder],
    data_dir: Path,
    busy: Callable[[], bool] = lambda: False,
    history: ReleaseHistory | None = None,
    server_db: Callable[[Tables], ServerDb] | None = None,  # the store's (else shadow.db)
) -> ShadowManager | None:
    """One manager for every declared pair. A pair whose shadow cannot run is logged at
    WARNING here, once, and kept as `unavailable` so ShadowStatus says why."""
    shadows: dict[str, Embedder] = {}
    unavailable: dict[str, str] = {}
    for case, cfg in pairs.items():
        if cfg.canonical not in (canonical.name, getattr(canonical, "family", canonical.name)):
            unavailable[case] = (
                f"koder.toml declares canonical {cfg.canonical!r} but this server embeds "
                f"with {canonical.name!r}"
            )
        elif case in given:
            shadows[case] = given[case]
            continue
        else:
            try:
                shadows[case] = load_embedder(
                    cfg.shadow,
                    model_dir=settings.model_dir,
                    device=settings.device,
                    max_seq_length=settings.max_seq_length,
                )
                continue
            except (ValueError, OSError) as exc:
                unavailable[case] = f"shadow {cfg.shadow!r} cannot load: {exc}"
        log.warning("shadow of %s is off: %s", case, unavailable[case])
    if not shadows and not unavailable:
        return None
    store = (EvidenceStore(db=server_db(evidence.TABLES)) if server_db is not None
             else EvidenceStore(data_dir / "shadow.db"))
    return ShadowManager(
        pairs,
        canonical,
        shadows,
        store,
        queue_size=settings.shadow_queue_size,
        busy=busy,
        history=history,
        unavailable=unavailable,
        signer=Signer.in_dir(data_dir),
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_server(
    settings: Settings,
    *,
    runtime: Runtime | None = None,
    embedder: Embedder | None = None,
    clock: Callable[[], float] = time.time,
    shadow_embedders: dict[str, Embedder] | None = None,
) -> tuple[grpc.Server, int, Runtime]:
    runtime = runtime or build_runtime(
        settings, embedder=embedder, clock=clock, shadow_embedders=shadow_embedders
    )
    if not runtime.keys.enabled:
        if not _is_loopback(settings.host):
            runtime.close()
            raise InvalidArgument(
                f"refusing to bind {settings.host} without API keys; create a key "
                "(`ragplane admin keys create`, or set RAGPLANE_BOOTSTRAP_ADMIN_KEY) or bind "
                "127.0.0.1"
            )
        log.warning(
            "no API keys configured: authentication is OFF and the server binds loopback only"
        )
    options = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    try:
        cores = cpus.configure(settings.rpc_cpus)
    except InvalidArgument:
        runtime.close()
        raise
    if cores.cores is not None:
        log.info("gRPC's threads run requests on core %s (rpc_cpus=%s)",
                 ",".join(map(str, sorted(cores.cores))), settings.rpc_cpus)  # fmt: skip
    pool = CountingExecutor(max_workers=settings.workers, thread_name_prefix="rpc",
                            initializer=cores.pin_this_thread)  # fmt: skip
    admission = Admission(pool, limit=settings.workers * 8)
    runtime.closing.callback(admission.close)
    follower = runtime.backend.follower  # a store shared by many servers
    interceptor = ServerInterceptor(
        before=runtime.keys.authenticate, after=runtime.metrics.observe_rpc, admission=admission,
        cores=cores if cores.cores is not None else None,
        consistency=Gate(follower, settings.consistency_wait_ms) if follower else None,
    )
    # No maximum_concurrent_rpcs: gRPC would refuse without retry-after; Admission caps instead.
    server = grpc.server(pool, interceptors=[interceptor], options=options)
    _add_services(server, runtime, settings)
    address = f"{settings.host}:{settings.port}"
    try:
        if settings.tls_cert:
            port = server.add_secure_port(address, _tls_credentials(settings))
        else:
            port = server.add_insecure_port(address)
    except Exception:
        runtime.close()
        raise
    if port == 0:
        runtime.close()
        raise InvalidArgument(f"cannot bind {address}; is another server using the port?")
    runtime.metrics.attach(_Gauges(runtime))
    if settings.metrics_port:
        runtime.metrics_port = runtime.metrics.serve(settings.metrics_port, settings.host)
        runtime.closing.callback(runtime.metrics.close)
    if settings.http_port:
        try:
            runtime.http = serve_http(
                settings, runtime.embedding, runtime.keys, runtime.metrics, admission, runtime
            )
        except Exception:
            runtime.close()
            raise
        runtime.closing.callback(runtime.http.close)
    return server, port, runtime


def _add_services(server: grpc.Server, runtime: Runtime, settings: Settings) -> None:
    """Register every servicer, health (SERVING until shutdown) and reflection."""
    info = embed_pb2.InfoResponse(
        model=runtime.embedding.canonical.model,
        dim=runtime.embedding.dim,
        max_seq_length=settings.max_seq_length,
        max_batch_texts=settings.max_batch_texts,
        max_text_bytes=settings.max_text_bytes,
    )
    embed_pb2_grpc.add_EmbedServiceServicer_to_server(
        EmbedServicer(runtime.embedding, info), server
    )
    index_pb2_grpc.add_IndexServiceServicer_to_server(IndexServicer(runtime.collections), server)
    search_pb2_grpc.add_SearchServiceServicer_to_server(SearchServicer(runtime.collections), server)
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(MemoryServicer(runtime.memory), server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(runtime.admin), server)
    services = [
        embed_pb2.DESCRIPTOR.services_by_name["EmbedService"].full_name,
        index_pb2.DESCRIPTOR.services_by_name["IndexService"].full_name,
        search_pb2.DESCRIPTOR.services_by_name["SearchService"].full_name,
        memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name,
        admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    ]

    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *services]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    store_services = ["", *services[1:4]]  # the overall status and Index, Search, Memory
    runtime.health = HealthState(health_servicer, runtime.backend.follower, store_services)
    runtime.closing.callback(runtime.health.close)
    reflection.enable_server_reflection(
        [
            *services,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )


class _Gauges:
    """The runtime as `ragplane.server.metrics.RuntimeGauges` sees it."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def queued_texts(self) -> int:
        return self._rt.embedding.queued_texts

    def search_batch_mean(self) -> float:
        co = self._rt.collections.searches
        return co.queries / co.calls if co.calls else 0.0

    def collections(self) -> list[CollectionInfo]:
        return self._rt.admin.user_collections()

    def shadow_status(self) -> list[CaseStatus]:
        return self._rt.shadow.status() if self._rt.shadow is not None else []

    def store_position(self) -> tuple[int, float] | None:
        follower = self._rt.backend.follower
        return None if follower is None else (follower.applied, follower.lag_seconds())


def _tls_credentials(settings: Settings) -> grpc.ServerCredentials:
    def read(path: str, what: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {what} {path}: {exc.strerror}") from None

    cert = read(settings.tls_cert, "tls_cert")
    key = read(settings.tls_key, "tls_key")
    if settings.tls_client_ca:
        ca = read(settings.tls_client_ca, "tls_client_ca")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )
    return grpc.ssl_server_credentials([(key, cert)])


def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then drain in-flight calls and flush state."""
    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info(
            "received %s; draining for up to %.0fs",
            signal.Signals(signum).name,
            settings.grace_seconds,
        )
        stop.set()

    # Handlers first: a supervisor may signal as soon as the port file appears.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server, port, runtime = create_server(settings)
    server.start()
    if settings.port_file:
        tmp = Path(settings.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(settings.port_file)
    log.info(
        "ragplane %s serving on %s:%d (embedder %s, data %s%s%s%s)",
        __version__,
        settings.host,
        port,
        runtime.embedding.canonical.identity,
        runtime.backend.where,
        ", TLS" if settings.tls_cert else "",
        f", metrics on :{runtime.metrics_port}" if runtime.metrics_port else "",
        f", OpenAI-compatible HTTP on :{runtime.http.port}" if runtime.http else "",
    )
    # Python runs signal handlers on the main thread between bytecodes; a bare wait() can
    # sleep through a signal that the kernel delivered to one of gRPC's threads.
    while not stop.wait(0.5):
        pass
    if runtime.health is not None:
        runtime.health.close()
    if runtime.http is not None:
        runtime.http.drain()  # alongside gRPC's: in-flight calls of both get the grace
    server.stop(settings.grace_seconds).wait()
    runtime.close()
    log.info("stopped cleanly")
