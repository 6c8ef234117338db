"""The one table from domain errors to gRPC status codes, and the interceptor that applies it.

Every servicer method runs inside the interceptor's wrapper (on the event loop of
`ragplane.server.grpc_loop`; the servicer itself on the handler pool): a RagplaneError
becomes its status with its message; anything else is a bug, logged with its traceback
and returned as INTERNAL with a request id to quote. RESOURCE_EXHAUSTED carries a
`retry-after` trailer (seconds) and `grpc-retry-pushback-ms`, which gRPC clients with retry
policies honour; so does a call refused past the cap on concurrent calls
(`ragplane.server.admission`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from ragplane.core import errors
from ragplane.server.admission import Admission
from ragplane.server.grpc_loop import Aborted, CallContext, blocking_iter, in_pool

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


def status_of(exc: BaseException) -> grpc.StatusCode | None:
    for cls in type(exc).__mro__:
        code = STATUS_OF.get(cls)  # type: ignore[call-overload]
        if code is not None:
            return code
    return None


async def _abort(
    context: grpc.aio.ServicerContext, call: CallContext | None, exc: BaseException, method: str
) -> None:
    """End the call with `exc`'s status (raises gRPC's AbortError, as aio's abort does)."""
    code = status_of(exc)
    if isinstance(exc, Aborted):
        code, message = exc.code, exc.details
    elif isinstance(exc, TimeoutError) and call is not None and not call.is_active():
        code, message = grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed"
    elif code is None:
        rid = request_id.get()
        log.error("bug in %s (request %s)", method, rid, exc_info=exc)
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
    await context.abort(code, message)


def _code(exc: BaseException) -> str:
    if isinstance(exc, Aborted):
        return exc.code.name
    return (status_of(exc) or grpc.StatusCode.INTERNAL).name


Hook = Callable[[str, Any], Any]


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Request ids, authentication (`before` hook), admission, error mapping and metrics
    (`after`); a servicer's work runs on `pool`, everything else on the event loop."""

    def __init__(
        self,
        before: Hook | None = None,
        after: Callable[[str, str, float], None] | None = None,
        admission: Admission | None = None,
        consistency: Any = None,
        pool: futures.Executor | None = None,
    ) -> None:
        """`consistency` (a `ragplane.server.consistency.Gate`, with a PostgreSQL store)
        sees each unary request before its servicer and each reply after it. `pool`: where
        servicers run (None: the loop's default executor)."""
        self._before = before
        self._after = after
        self._admission = admission
        self._gate = consistency
        self._pool = pool
        # method: (its handler, its refusal past the cap; None where none applies)
        self._wrapped: dict[str, tuple[Any, Any | None]] = {}

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[override]
        # A method's wrapped handlers are built once, on its first call: this runs on the
        # event loop for every call, so per-call work here delays them all.
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:
                return None  # not cached: unknown names are the caller's to choose
            if method.startswith(("/grpc.health.", "/grpc.reflection.")):
                wrapped = (handler, None)  # served as they are, never refused
            else:
                if handler.request_deserializer is not None:
                    handler = handler._replace(
                        request_deserializer=_safe_deserializer(handler.request_deserializer)
                    )
                refusal = None if self._admission is None else self._refusal(method, handler)
                wrapped = (self._wrap(method, handler), refusal)
            self._wrapped[method] = wrapped
        served, refusal = wrapped
        if refusal is not None and not self._admission.admit():  # type: ignore[union-attr]
            return refusal
        return served

    def _start(self, context: grpc.aio.ServicerContext) -> None:
        """On the loop: the call's request id (the caller's or a new one), in its trailers
        and its context variables (which its pool work copies)."""
        rid = ""
        for key, value in context.invocation_metadata() or ():
            if key == "x-request-id":
                rid = value
        rid = rid or os.urandom(8).hex()
        request_id.set(rid)
        context.set_trailing_metadata((("x-request-id", rid),))

    def _finish(self, method: str, t0: float, code: str) -> None:
        seconds = time.perf_counter() - t0
        log.debug("%s %s %.2fms", method, code, seconds * 1e3)  # the access log
        if self._after is not None:
            self._after(method, code, seconds)

    def _refusal(self, method: str, handler: Any) -> Any:
        """`handler` answering RESOURCE_EXHAUSTED on the loop (past the cap on concurrent
        calls), after authentication, so a caller without a key still learns that first."""
        assert self._admission is not None
        message = self._admission.message()
        before = self._before

        async def refuse(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()
            self._start(context)
            call = CallContext(context)
            exc: Exception = errors.ResourceExhausted(message)
            try:
                if before is not None:
                    before(method, call)
            except Exception as refused:
                exc = refused
            try:
                await _abort(context, call, exc, method)
            finally:
                self._finish(method, t0, _code(exc))

        if not (handler.unary_unary or handler.stream_unary):
            refuse_stream = refuse

            async def refuse(request_or_iterator: Any, context: Any) -> Any:  # type: ignore[no-redef]
                await refuse_stream(request_or_iterator, context)
                yield  # pragma: no cover - never reached: the call is aborted

        return _with_behavior(handler, refuse)

    def _wrap(self, method: str, handler: Any) -> Any:
        """`handler` run inside the request id, authentication, error mapping and metrics,
        its behavior on the pool."""
        before, pool = self._before, self._pool
        gate = self._gate if self._gate is not None and self._gate.applies(method) else None
        behavior = _behavior(handler)
        streams_in = bool(handler.stream_unary or handler.stream_stream)

        def run(request_or_iterator: Any, call: CallContext) -> Any:  # on the pool
            if before is not None:
                before(method, call)
            request = _checked(request_or_iterator)
            if gate is None:
                return behavior(request, call)
            gate.before(request)
            return gate.after(behavior(request, call))

        def messages(request_or_iterator: Any) -> Any:
            if streams_in:
                return blocking_iter(request_or_iterator, asyncio.get_running_loop())
            return request_or_iterator

        async def unary(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()
            code = "OK"
            self._start(context)
            call = CallContext(context)
            try:
                return await in_pool(pool, run, messages(request_or_iterator), call)
            except asyncio.CancelledError:
                call.closed, code = True, "CANCELLED"
                raise
            except Exception as exc:
                code = _code(exc)
                await _abort(context, call, exc, method)
            finally:
                self._finish(method, t0, code)

        def begin(request_or_iterator: Any, call: CallContext) -> Iterator[Any]:  # on the pool
            if before is not None:
                before(method, call)
            return iter(behavior(_checked(request_or_iterator), call))

        async def stream(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()
            code = "OK"
            self._start(context)
            call = CallContext(context)
            try:
                replies = await in_pool(pool, begin, messages(request_or_iterator), call)
                while (reply := await in_pool(pool, next, replies, _END)) is not _END:
                    yield reply
            except (asyncio.CancelledError, GeneratorExit):
                call.closed, code = True, "CANCELLED"
                raise
            except Exception as exc:
                code = _code(exc)
                await _abort(context, call, exc, method)
            finally:
                self._finish(method, t0, code)

        return _with_behavior(
            handler, unary if handler.unary_unary or handler.stream_unary else stream
        )


_END = object()
_FIELDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _behavior(handler: grpc.RpcMethodHandler) -> Any:
    return (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )


def _with_behavior(handler: Any, behavior: Any) -> Any:
    """`handler` with its one behavior (whichever of the four kinds it is) replaced."""
    field = next(f for f in _FIELDS if getattr(handler, f))
    return handler._replace(**{field: behavior})


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
    if isinstance(request_or_iterator, _Undecodable):
        raise errors.InvalidArgument(
            f"the request could not be parsed ({request_or_iterator.reason}); string fields "
            "must be valid UTF-8"
        )
    if hasattr(request_or_iterator, "__next__"):
        return (_checked(r) for r in request_or_iterator)
    return request_or_iterator
