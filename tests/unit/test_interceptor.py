"""The interceptor builds a method's wrapped handlers once (it runs on gRPC's one polling
thread for every call) and still picks, per call, the refusal past the cap."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from ragplane.core import errors
from ragplane.server.admission import Admission, CountingExecutor
from ragplane.server.interceptors import ServerInterceptor


class _Context:
    def __init__(self, metadata=()) -> None:
        self.metadata = tuple(metadata)
        self.trailers: tuple = ()
        self.aborted: tuple | None = None

    def invocation_metadata(self):
        return self.metadata

    def set_trailing_metadata(self, md) -> None:
        self.trailers = tuple(md)

    def is_active(self) -> bool:
        return True

    def abort(self, code, message):
        self.aborted = (code, message)
        raise Exception()  # what gRPC's abort raises once the status is set


def _echo(request, context):
    return ("echo", request)


@pytest.fixture
def pool():
    p = CountingExecutor(max_workers=1)
    yield p
    p.shutdown()


def test_a_methods_handlers_are_built_once_and_refusal_is_chosen_per_call(pool):
    lookups: list[str] = []
    handler = grpc.unary_unary_rpc_method_handler(_echo)

    def continuation(details):
        lookups.append(details.method)
        return handler

    admission = Admission(pool, limit=1)
    seen: list[tuple[str, str]] = []
    icpt = ServerInterceptor(after=lambda m, code, s: seen.append((m, code)), admission=admission)
    details = SimpleNamespace(method="/ragplane.v1.SearchService/Search")
    served = [icpt.intercept_service(continuation, details) for _ in range(3)]
    assert lookups == [details.method] and served[0] is served[1] is served[2]
    ctx = _Context([("x-request-id", "abc")])
    assert served[0].unary_unary("q", ctx) == ("echo", "q")
    assert ctx.trailers == (("x-request-id", "abc"),) and seen == [(details.method, "OK")]

    pool.in_flight = 1  # at the cap: this call gets the refusal, from the same cache
    refused = icpt.intercept_service(continuation, details)
    assert refused is not served[0] and lookups == [details.method]
    ctx = _Context()
    with pytest.raises(Exception):  # noqa: B017 - gRPC's abort
        refused.unary_unary("q", ctx)
    assert ctx.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(ctx.trailers)["retry-after"] and len(dict(ctx.trailers)["x-request-id"]) == 16
    pool.in_flight = 0
    assert icpt.intercept_service(continuation, details) is served[0]
    admission.close()


def test_an_unknown_method_is_not_cached():
    icpt = ServerInterceptor()
    names = [f"/x.Y/M{i}" for i in range(3)]
    for n in names:
        assert icpt.intercept_service(lambda d: None, SimpleNamespace(method=n)) is None
    assert not icpt._wrapped


def test_a_domain_error_is_its_status_with_the_request_id():
    def bad(request, context):
        raise errors.InvalidArgument("top_k must be in 1..1000")

    icpt = ServerInterceptor()
    details = SimpleNamespace(method="/ragplane.v1.SearchService/Search")
    h = icpt.intercept_service(lambda d: grpc.unary_unary_rpc_method_handler(bad), details)
    ctx = _Context()
    with pytest.raises(Exception):  # noqa: B017 - gRPC's abort
        h.unary_unary("q", ctx)
    assert ctx.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "top_k must be in 1..1000")
