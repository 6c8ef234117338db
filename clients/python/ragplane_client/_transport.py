"""Connection settings shared by both clients: targets, TLS, the API key, channel options,
the retry policy, and which RPCs may be retried (read from the protos' idempotency
levels, so the two cannot drift apart).

The server refuses overload (a full queue, its cap on concurrent calls, a full disk) with
RESOURCE_EXHAUSTED and a `retry-after` trailer in seconds; UNAVAILABLE means it could not
be reached (or is shutting down). Both are retried, waiting `retry-after` when the server
sent one and an exponential backoff with jitter otherwise, for at most `max_attempts`
attempts, each on the next target.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf import descriptor_pb2

from ragplane_client.v1 import (
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

DEFAULT_TARGET = "127.0.0.1:50051"
_RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of RESOURCE_EXHAUSTED and UNAVAILABLE.

    `max_attempts` counts the first call (1 = no retries). Without a `retry-after` from the
    server, attempt n waits a random time in [b/2, b], b = min(max_backoff,
    initial_backoff * multiplier ** n) seconds; with one, exactly that many seconds, capped
    at `max_retry_after`. UNAVAILABLE is retried only for RPCs the protos mark idempotent
    or free of side effects (every one but CreateCollection and Remember), since it may
    come after the server acted; RESOURCE_EXHAUSTED always, since the server refuses
    before acting."""

    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    max_retry_after: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (0 = the first call)."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.max_retry_after))
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier**attempt)
        return random.uniform(cap / 2, cap)

    def retries(self, exc: grpc.RpcError, attempt: int, idempotent: bool) -> bool:
        """Whether failed attempt `attempt` (0-based) is tried again."""
        code = exc.code()
        if attempt + 1 >= self.max_attempts or code not in _RETRYABLE:
            return False
        return idempotent or code == grpc.StatusCode.RESOURCE_EXHAUSTED


NO_RETRY = RetryPolicy(max_attempts=1)


def retry_after(exc: grpc.RpcError) -> float | None:
    """The server's `retry-after` trailer in seconds (else `grpc-retry-pushback-ms`)."""
    try:
        trailers = dict(exc.trailing_metadata() or ())
    except Exception:  # an error raised before the call had trailers
        return None
    for key, scale in (("retry-after", 1.0), ("grpc-retry-pushback-ms", 1e-3)):
        if key in trailers:
            try:
                return float(trailers[key]) * scale
            except ValueError:
                continue
    return None


@dataclass(frozen=True)
class Rpc:
    service: str  # an attribute of Stubs
    method: str
    idempotent: bool


_SERVICES = {
    "embed": (embed_pb2, "EmbedService"),
    "index": (index_pb2, "IndexService"),
    "search": (search_pb2, "SearchService"),
    "memory": (memory_pb2, "MemoryService"),
    "admin": (admin_pb2, "AdminService"),
}


def rpc(service: str, method: str) -> Rpc:
    module, name = _SERVICES[service]
    desc = module.DESCRIPTOR.services_by_name[name].methods_by_name[method]
    level = desc.GetOptions().idempotency_level
    return Rpc(service, method, level != descriptor_pb2.MethodOptions.IDEMPOTENCY_UNKNOWN)


@dataclass(frozen=True)
class Stubs:
    """The generated stubs of every service on one channel (sync or grpc.aio); they carry
    the client's API key. For RPCs the client has no method for (admin, EmbedStream)."""

    embed: embed_pb2_grpc.EmbedServiceStub
    index: index_pb2_grpc.IndexServiceStub
    search: search_pb2_grpc.SearchServiceStub
    memory: memory_pb2_grpc.MemoryServiceStub
    admin: admin_pb2_grpc.AdminServiceStub

    @classmethod
    def of(cls, channel: Any) -> Stubs:
        return cls(
            embed_pb2_grpc.EmbedServiceStub(channel),
            index_pb2_grpc.IndexServiceStub(channel),
            search_pb2_grpc.SearchServiceStub(channel),
            memory_pb2_grpc.MemoryServiceStub(channel),
            admin_pb2_grpc.AdminServiceStub(channel),
        )


@dataclass(frozen=True)
class Config:
    targets: tuple[str, ...]
    credentials: grpc.ChannelCredentials | None  # None = plaintext
    metadata: tuple[tuple[str, str], ...]
    options: tuple[tuple[str, Any], ...]
    timeout: float | None
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def _pem(x: bytes | str | Path | None) -> bytes | None:
    """PEM bytes as given, or read from a path."""
    if x is None or isinstance(x, bytes):
        return x
    return Path(x).read_bytes()


def config(
    targets: str | Any,
    *,
    api_key: str | None = None,
    tls: bool = False,
    root_certificates: bytes | str | Path | None = None,
    client_certificate: bytes | str | Path | None = None,
    client_key: bytes | str | Path | None = None,
    allow_plaintext_key: bool = False,
    timeout: float | None = 30.0,
    retry: RetryPolicy | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
    channel_options: Any = (),
) -> Config:
    """The client's constructor arguments, checked (see Client)."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if not targets:
        raise ValueError("at least one target (host:port) is needed")
    if (client_certificate is None) != (client_key is None):
        raise ValueError("client_certificate and client_key go together (mutual TLS)")
    tls = tls or root_certificates is not None or client_certificate is not None
    creds = None
    if tls:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_pem(root_certificates),
            private_key=_pem(client_key),
            certificate_chain=_pem(client_certificate),
        )
    metadata: tuple[tuple[str, str], ...] = ()
    if api_key:
        if not tls and not allow_plaintext_key:
            raise ValueError(
                "an API key needs TLS (tls=True or root_certificates); pass "
                "allow_plaintext_key=True for a loopback port or a TLS-terminating sidecar"
            )
        metadata = (("authorization", f"Bearer {api_key}"),)
    options = (
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *tuple(channel_options),
    )
    return Config(targets, creds, metadata, options, timeout, retry or RetryPolicy())


def sync_channel(cfg: Config, target: str) -> grpc.Channel:
    opts = list(cfg.options)
    if cfg.credentials is None:
        ch = grpc.insecure_channel(target, options=opts)
    else:
        ch = grpc.secure_channel(target, cfg.credentials, options=opts)
    return grpc.intercept_channel(ch, _Key(cfg.metadata)) if cfg.metadata else ch


def aio_channel(cfg: Config, target: str) -> grpc.aio.Channel:
    opts = list(cfg.options)
    icpt = [k(cfg.metadata) for k in _AIO_KEYS] if cfg.metadata else None
    if cfg.credentials is None:
        return grpc.aio.insecure_channel(target, options=opts, interceptors=icpt)
    return grpc.aio.secure_channel(target, cfg.credentials, options=opts, interceptors=icpt)


_DETAILS = ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")


class _Details(collections.namedtuple("_Details", _DETAILS), grpc.ClientCallDetails):
    pass


class _Key(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the API key's metadata to every call of a sync channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._md = metadata

    def _d(self, d: grpc.ClientCallDetails) -> _Details:
        md = [*(d.metadata or ()), *self._md]
        return _Details(
            d.method,
            d.timeout,
            md,
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[override]
        return continuation(self._d(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[override]
        return continuation(self._d(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[override]
        return continuation(self._d(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[override]
        return continuation(self._d(details), requests)


class _AioKey:
    """Adds the API key's metadata to calls of a grpc.aio channel. grpc.aio files an
    interceptor under one kind only, so there is a subclass per kind."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._md = metadata

    def _d(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(d.metadata or ()), *self._md)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)

    async def _go(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._d(details), request)


class _AioKeyUU(_AioKey, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _AioKey._go  # type: ignore[assignment]


class _AioKeyUS(_AioKey, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _AioKey._go  # type: ignore[assignment]


class _AioKeySU(_AioKey, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _AioKey._go  # type: ignore[assignment]


class _AioKeySS(_AioKey, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _AioKey._go  # type: ignore[assignment]


_AIO_KEYS = (_AioKeyUU, _AioKeyUS, _AioKeySU, _AioKeySS)
