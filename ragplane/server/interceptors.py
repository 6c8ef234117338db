"""The one table from domain errors to gRPC status codes, and the interceptor that applies it.

Every servicer method runs inside `_guard`: a RagplaneError becomes its status with its
message; anything else is a bug, logged with its traceback and returned as INTERNAL
with a request id to quote. RESOURCE_EXHAUSTED carries a `retry-after` trailer
(seconds) and `grpc-retry-pushback-ms`, which gRPC clients with retry policies honour;
so does a call refused past the cap on concurrent calls (`ragplane.server.admission`).
"""

from __future__ import annotations

import contextvars
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from ragplane.core import errors
from ragplane.core.cpus import RequestCores
from ragplane.server.admission import Admission

log = logging.getLogger(__name__)

STATUS_OF: dict[type[errors.RagplaneError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StorageFull: grpc.StatusCode.RESOURCE_EXHAUSTED,  # with retry-after: space may return
    errors.StorageReadOnly: grpc.StatusCode.FAILED_PRECONDITION,  # an operator must act first
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Corrupt: grpc.StatusCode.DATA_LOSS,
}

#: The id of the call being served, for logs (set by the interceptor).
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


# Request ids from a generator of the process's own (reseeded in a forked child), not
# os.urandom: its getrandom call releases the GIL, which under load costs the call two
# context switches to take it back.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def _new_request_id() -> str:
    return f"{_ids.getrandbits(64):016x}"


def status_of(exc: BaseException) -> grpc.StatusCode | None:
    for cls in type(exc).__mro__:
        code = STATUS_OF.get(cls)  # type: ignore[call-overload]
        if code is not None:
            return code
    return None


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    code = status_of(exc)
    if isinstance(exc, TimeoutError) and not context.is_active():
        code, message = grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed"
    elif code is None:
        rid = request_id.get()
        log.exception("bug in %s (request %s)", method, rid)
        code, message = (
            grpc.StatusCode.INTERNAL,
            f"internal error (request id {rid}); this is a bug",
        )
    else:
        message = str(exc)
    if isinstance(exc, (errors.ResourceExhausted, errors.Unavailable)):
        # set_trailing_metadata replaces the whole set: the request id that `start` put
        # there goes in again, or the caller of a refused call would have none to quote.
        context.set_trailing_metadata(
            (
                ("x-request-id", request_id.get()),
                ("retry-after", f"{exc.retry_after:.3f}"),
                ("grpc-retry-pushback-ms", str(int(exc.retry_after * 1000))),
            )
        )
    context.abort(code, message)


Hook = Callable[[str, grpc.ServicerContext], Any]


class ServerInterceptor(grpc.ServerInterceptor):
    """Request ids, authentication (`before` hook), error mapping and metrics (`after`)."""

    def __init__(
        self,
        before: Hook | None = None,
        after: Callable[[str, str, float], None] | None = None,
        admission: Admission | None = None,
        consistency: Any = None,
        cores: RequestCores | None = None,
    ) -> None:
        """`consistency` (a `ragplane.server.consistency.Gate`, with a PostgreSQL store)
        sees each unary request before its servicer and each reply after it. `cores`: the
        request cores gRPC's polling thread is pinned to (`ragplane.core.cpus`), on the
        first call it dispatches (it starts inside gRPC; the handler pool pins its own)."""
        self._cores = cores
        self._before = before
        self._after = after
        self._admission = admission
        self._gate = consistency
        # method: (its handler, its refusal past the cap; None where none applies)
        self._wrapped: dict[str, tuple[Any, Any | None]] = {}

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[override]
        # A method's wrapped handlers are built once, on its first call: this runs on
        # gRPC's one polling thread for every call, so per-call work here delays them all.
        method = handler_call_details.method
        cores = self._cores
        if cores is not None and not cores.pinned_here():
            cores.pin_this_thread()
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = continuation(handler_call_details)
            if handler is None:
                return None  # not cached: unknown names are the caller's to choose
            if method.startswith(("/grpc.health.", "/grpc.reflection.")):
                wrapped = (handler, None)  # served as they are, never refused
            else:
                refusal = None if self._admission is None else self._wrap(method, handler, True)
                wrapped = (self._wrap(method, handler, False), refusal)
            self._wrapped[method] = wrapped
        served, refusal = wrapped
        if refusal is not None and not self._admission.admit():  # type: ignore[union-attr]
            return refusal
        return served

    def _wrap(self, method: str, handler: Any, refused: bool) -> Any:
        """`handler` run inside the request id, authentication, error mapping and metrics;
        `refused`: its behavior replaced by the refusal past the cap on concurrent calls."""
        before, after = self._before, self._after
        admission = self._admission
        gate = self._gate if self._gate is not None and self._gate.applies(method) else None
        if refused:
            assert admission is not None
            handler = _refusing(handler, admission.message())

        def start(context: grpc.ServicerContext) -> float:
            rid = ""
            for key, value in context.invocation_metadata():
                if key == "x-request-id":
                    rid = value
            rid = rid or _new_request_id()
            request_id.set(rid)
            context.set_trailing_metadata((("x-request-id", rid),))
            if before is not None:
                before(method, context)
            return time.perf_counter()

        def finish(t0: float, code: str) -> None:
            seconds = time.perf_counter() - t0
            log.debug("%s %s %.2fms", method, code, seconds * 1e3)  # the access log
            if after is not None:
                after(method, code, seconds)

        def wrap_unary(behavior):
            def wrapped(request_or_iterator, context):
                t0 = time.perf_counter()
                code = "OK"
                try:
                    t0 = start(context)
                    request = _checked(request_or_iterator)
                    if gate is None:
                        return behavior(request, context)
                    gate.before(request)
                    return gate.after(behavior(request, context))
                except Exception as exc:
                    code = (status_of(exc) or grpc.StatusCode.INTERNAL).name
                    if _is_abort(exc):
                        raise
                    _abort(context, exc, method)
                finally:
                    finish(t0, code)

            return wrapped

        def wrap_stream(behavior):
            def wrapped(request_or_iterator, context) -> Iterator[Any]:
                t0 = time.perf_counter()
                code = "OK"
                try:
                    t0 = start(context)
                    yield from behavior(_checked(request_or_iterator), context)
                except Exception as exc:
                    code = (status_of(exc) or grpc.StatusCode.INTERNAL).name
                    if _is_abort(exc):
                        raise
                    _abort(context, exc, method)
                finally:
                    finish(t0, code)

            return wrapped

        if handler.request_deserializer is not None:
            handler = handler._replace(
                request_deserializer=_safe_deserializer(handler.request_deserializer)
            )
        wrapped = _wrap_behavior(handler, wrap_unary, wrap_stream)
        if refused:
            behavior = _behavior(wrapped)
            # gRPC runs a behavior with this attribute on that pool instead of its own
            behavior.experimental_thread_pool = admission.refusals  # type: ignore[union-attr]
        return wrapped


def _behavior(handler: grpc.RpcMethodHandler) -> Any:
    return (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )


def _wrap_behavior(handler: Any, wrap_unary: Callable, wrap_stream: Callable) -> Any:
    if handler.unary_unary:
        return handler._replace(unary_unary=wrap_unary(handler.unary_unary))
    if handler.unary_stream:
        return handler._replace(unary_stream=wrap_stream(handler.unary_stream))
    if handler.stream_unary:
        return handler._replace(stream_unary=wrap_unary(handler.stream_unary))
    if handler.stream_stream:
        return handler._replace(stream_stream=wrap_stream(handler.stream_stream))
    return handler


def _refusing(handler: Any, message: str) -> Any:
    """`handler` with its behavior replaced by a refusal (ResourceExhausted): past the cap
    on concurrent calls."""

    def refuse(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
        raise errors.ResourceExhausted(message)

    field = next(
        f
        for f in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        if getattr(handler, f)
    )
    return handler._replace(**{field: refuse})


class _Undecodable:
    """What a request that failed to parse (bad wire bytes, invalid UTF-8) turns into, so
    the servicer wrapper can answer INVALID_ARGUMENT instead of gRPC's INTERNAL."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe_deserializer(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def safe(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError, UnicodeDecodeError, ...
            return _Undecodable(str(exc) or type(exc).__name__)

    return safe


def _checked(request_or_iterator: Any) -> Any:
    if isinstance(request_or_iterator, Message):  # a unary call's, parsed (the common case:
        return request_or_iterator  # hasattr below costs a raised AttributeError on these)
    if isinstance(request_or_iterator, _Undecodable):
        raise errors.InvalidArgument(
            f"the request could not be parsed ({request_or_iterator.reason}); string fields "
            "must be valid UTF-8"
        )
    if hasattr(request_or_iterator, "__next__"):
        return (_checked(r) for r in request_or_iterator)
    return request_or_iterator


def _is_abort(exc: BaseException) -> bool:
    # context.abort() raises a bare, argument-less Exception once the status is set.
    return type(exc) is Exception and not exc.args
