"""An abstract Locust `User` that talks gRPC and reports every call to Locust's statistics.

This follows Locust's documented gRPC pattern (a client interceptor that fires
`environment.events.request` per call, and `grpc.experimental.gevent.init_gevent()` so that
blocking stubs yield to other users instead of blocking the process), without the third-party
`grpc-interceptor` package: the interceptor implements grpc's own interfaces for unary and
streaming calls.

Each reported call is named `Service/Method` (e.g. `EmbedService/Embed`), its response time is
wall time in milliseconds from the call until the last response message, its length is the
serialized size of the responses in bytes, and any non-OK status is reported as an
`RpcFailure` ("CODE: details") so Locust groups failures by status and message.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import locust  # noqa: F401  (first: Locust monkey-patches the process with gevent on import)

# isort: split
import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import User
from locust.env import Environment
from locust.exception import LocustError

from ragplane.v1 import (
    admin_pb2_grpc,
    embed_pb2_grpc,
    index_pb2_grpc,
    memory_pb2_grpc,
    search_pb2_grpc,
)

# Without this, a blocking stub call holds the whole process (every simulated user) until
# the server answers. It must run before the first channel is created.
grpc_gevent.init_gevent()

API_KEY_ENV = "RAGPLANE_API_KEY"
# Every call gets a deadline so a stuck server fails calls (DEADLINE_EXCEEDED) instead of
# stretching a bounded run without limit.
DEFAULT_TIMEOUT_S = 30.0
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


class RpcFailure(Exception):
    """A call that ended with a non-OK status; str() is "CODE: details"."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"{code.name}: {details or ''}")
        self.code = code
        self.details = details


def auth_metadata(api_key: str | None = None) -> tuple[tuple[str, str], ...]:
    """`authorization: Bearer <key>` from `api_key` or $RAGPLANE_API_KEY; empty without one."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
    return (("authorization", f"Bearer {key}"),) if key else ()


def rpc_name(method: str | bytes) -> str:
    """ "/ragplane.v1.EmbedService/Embed" -> "EmbedService/Embed"."""
    if isinstance(method, bytes):
        method = method.decode()
    service, _, name = method.lstrip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class LocustInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Reports each call to `environment.events.request`; adds auth metadata and a deadline.

    A unary response is awaited here to time it, so `stub.Method.future(...)` behaves like
    a blocking call; the scenarios only make blocking calls, one per task.
    """

    def __init__(
        self,
        environment: Environment,
        metadata: tuple[tuple[str, str], ...] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.env = environment
        self.metadata = metadata
        self.timeout_s = timeout_s

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(
            d.method,
            d.timeout if d.timeout is not None else self.timeout_s,
            (*(d.metadata or ()), *self.metadata),
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def _fire(self, method: Any, start: float, length: int, exc: Exception | None) -> None:
        self.env.events.request.fire(
            request_type="grpc",
            name=rpc_name(method),
            response_time=(time.perf_counter() - start) * 1000.0,
            response_length=length,
            response=None,
            context=None,
            exception=exc,
        )

    def _unary_response(self, continuation: Callable, details: Any, request: Any) -> Any:
        details = self._details(details)
        start = time.perf_counter()
        outcome = continuation(details, request)  # failures come back as an outcome, not raised
        error = outcome.exception()
        if error is None:
            self._fire(details.method, start, outcome.result().ByteSize(), None)
        else:
            self._fire(details.method, start, 0, _as_failure(error))
        return outcome

    def _stream_response(self, continuation: Callable, details: Any, request: Any) -> Any:
        details = self._details(details)
        start = time.perf_counter()
        return _ReportingStream(self, details.method, start, continuation(details, request))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return self._unary_response(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return self._unary_response(continuation, client_call_details, request_iterator)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return self._stream_response(continuation, client_call_details, request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return self._stream_response(continuation, client_call_details, request_iterator)


def _as_failure(error: BaseException) -> Exception:
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return RpcFailure(error.code(), error.details())
    return error if isinstance(error, Exception) else RuntimeError(repr(error))


class _ReportingStream:
    """A response stream that reports once, when it ends (OK) or fails (non-OK status).

    The reported time covers the whole stream, the length every message in it. Attribute
    access falls through to the underlying call (`code()`, `cancel()`, ...).
    """

    def __init__(
        self, interceptor: LocustInterceptor, method: Any, start: float, call: Any
    ) -> None:
        self._interceptor = interceptor
        self._method = method
        self._start = start
        self._length = 0
        self._done = False
        self._call = call

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            msg = next(self._call)
        except StopIteration:
            self._report(None)
            raise
        except grpc.RpcError as error:
            self._report(_as_failure(error))
            raise
        self._length += msg.ByteSize()
        return msg

    def _report(self, exc: Exception | None) -> None:
        if not self._done:
            self._done = True
            self._interceptor._fire(self._method, self._start, self._length, exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class GrpcUser(User):
    """A Locust user with one channel to `host` ("127.0.0.1:50051") and a stub per service.

    Subclasses define tasks that call `self.embed`, `self.index`, `self.search`,
    `self.memory` or `self.admin`. The API key comes from $RAGPLANE_API_KEY (or `api_key`).
    """

    abstract = True
    api_key: str | None = None  # None: read $RAGPLANE_API_KEY
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        if not self.host:
            raise LocustError("GrpcUser needs a host, e.g. --host 127.0.0.1:50051")
        target = self.host.removeprefix("grpc://")
        interceptor = LocustInterceptor(environment, auth_metadata(self.api_key), self.timeout_s)
        self._raw_channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.channel = grpc.intercept_channel(self._raw_channel, interceptor)
        self.embed = embed_pb2_grpc.EmbedServiceStub(self.channel)
        self.index = index_pb2_grpc.IndexServiceStub(self.channel)
        self.search = search_pb2_grpc.SearchServiceStub(self.channel)
        self.memory = memory_pb2_grpc.MemoryServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def on_stop(self) -> None:
        self._raw_channel.close()
