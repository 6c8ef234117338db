"""The interceptor builds a method's wrapped handlers once (it runs on the event loop for
every call), still picks, per call, the refusal past the cap, runs the servicer on the
pool and ends a call with its error's status on the loop."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import grpc
import pytest

from ragplane.core import errors
from ragplane.server.admission import Admission, CountingExecutor
from ragplane.server.interceptors import ServerInterceptor, request_id


class _Aborted(Exception):
    pass


class _Context:
    """What the interceptor uses of gRPC's aio servicer context."""

    def __init__(self, metadata=(), time_remaining=None) -> None:
        self.metadata = tuple(metadata)
        self.trailers: tuple = ()
        self.aborted: tuple | None = None
        self.left = time_remaining

    def invocation_metadata(self):
        return self.metadata

    def set_trailing_metadata(self, md) -> None:
        self.trailers = tuple(md)

    def time_remaining(self):
        return self.left

    async def abort(self, code, message):
        self.aborted = (code, message)
        raise _Aborted()  # what gRPC's aio abort raises once the status is sent


def _echo(request, context):
    return ("echo", request, threading.current_thread().name, request_id.get())


@pytest.fixture
def pool():
    p = CountingExecutor(max_workers=1, thread_name_prefix="handler")
    yield p
    p.shutdown()


def _intercept(icpt, continuation, method):
    return asyncio.run(icpt.intercept_service(continuation, SimpleNamespace(method=method)))


def test_a_methods_handlers_are_built_once_and_refusal_is_chosen_per_call(pool):
    lookups: list[str] = []
    handler = grpc.unary_unary_rpc_method_handler(_echo)

    async def continuation(details):
        lookups.append(details.method)
        return handler

    admission = Admission(pool, limit=1)
    seen: list[tuple[str, str]] = []
    icpt = ServerInterceptor(
        after=lambda m, code, s: seen.append((m, code)), admission=admission, pool=pool
    )
    method = "/ragplane.v1.SearchService/Search"
    served = [_intercept(icpt, continuation, method) for _ in range(3)]
    assert lookups == [method] and served[0] is served[1] is served[2]
    ctx = _Context([("x-request-id", "abc")])
    # the servicer runs on the pool, in the call's request id
    assert asyncio.run(served[0].unary_unary("q", ctx)) == ("echo", "q", "handler_0", "abc")
    assert ctx.trailers == (("x-request-id", "abc"),) and seen == [(method, "OK")]

    pool.in_flight = 1  # at the cap: this call gets the refusal, from the same cache
    refused = _intercept(icpt, continuation, method)
    assert refused is not served[0] and lookups == [method]
    ctx = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(refused.unary_unary("q", ctx))
    assert ctx.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(ctx.trailers)["retry-after"] and len(dict(ctx.trailers)["x-request-id"]) == 16
    assert seen[-1] == (method, "RESOURCE_EXHAUSTED")
    pool.in_flight = 0
    assert _intercept(icpt, continuation, method) is served[0]


def test_an_unknown_method_is_not_cached():
    icpt = ServerInterceptor()

    async def unknown(details):
        return None

    for n in [f"/x.Y/M{i}" for i in range(3)]:
        assert _intercept(icpt, unknown, n) is None
    assert not icpt._wrapped


def _served(icpt, behavior, method="/ragplane.v1.SearchService/Search"):
    async def continuation(details):
        return grpc.unary_unary_rpc_method_handler(behavior)

    return _intercept(icpt, continuation, method)


def test_a_domain_error_is_its_status_with_the_request_id(pool):
    def bad(request, context):
        raise errors.InvalidArgument("top_k must be in 1..1000")

    h = _served(ServerInterceptor(pool=pool), bad)
    ctx = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(h.unary_unary("q", ctx))
    assert ctx.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "top_k must be in 1..1000")


def test_a_bug_is_internal_and_an_abort_on_the_pool_keeps_its_status(pool):
    def bug(request, context):
        raise KeyError("oops")

    def aborts(request, context):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now")

    icpt = ServerInterceptor(pool=pool)
    ctx = _Context([("x-request-id", "r1")])
    with pytest.raises(_Aborted):
        asyncio.run(_served(icpt, bug).unary_unary("q", ctx))
    assert ctx.aborted == (
        grpc.StatusCode.INTERNAL,
        "internal error (request id r1); this is a bug",
    )
    ctx = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(_served(icpt, aborts, "/ragplane.v1.SearchService/Other").unary_unary("q", ctx))
    assert ctx.aborted == (grpc.StatusCode.FAILED_PRECONDITION, "not now")


def test_a_timeout_past_the_deadline_is_deadline_exceeded(pool):
    def slow(request, context):
        assert not context.is_active()  # the deadline has passed
        raise TimeoutError

    ctx = _Context(time_remaining=0.0)
    with pytest.raises(_Aborted):
        asyncio.run(_served(ServerInterceptor(pool=pool), slow).unary_unary("q", ctx))
    assert ctx.aborted[0] is grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_streamed_reply_runs_on_the_pool_message_by_message(pool):
    def replies(request, context):
        for i in range(3):
            yield (request, i, threading.current_thread().name)

    async def continuation(details):
        return grpc.unary_stream_rpc_method_handler(replies)

    h = _intercept(ServerInterceptor(pool=pool), continuation, "/ragplane.v1.AdminService/R")

    async def collect():
        return [r async for r in h.unary_stream("q", _Context())]

    assert asyncio.run(collect()) == [("q", i, "handler_0") for i in range(3)]
