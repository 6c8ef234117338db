"""Admission: the cap on concurrent calls, answered like every other overload.

gRPC's own `maximum_concurrent_rpcs` refuses from its core with RESOURCE_EXHAUSTED and no
trailers, so a client cannot tell when to come back. Instead the handler pool counts the
calls it holds (submitted, not finished: the count gRPC compares), and the interceptor,
which gRPC runs on its event loop before a call is handed to the pool, refuses past the cap
with `errors.ResourceExhausted`, so the refusal gets the error table's `retry-after`.
The OpenAI-compatible HTTP API runs its calls on the same pool and asks the same
`Admission`, so one cap counts the calls of both transports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any


class CountingExecutor(futures.ThreadPoolExecutor):
    """The gRPC handler pool; `in_flight` is how many calls it holds, queued or running.
    Counted on the futures themselves, so a call that ends any way (cancelled before it
    ran included) is never left counted."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "",
                 initializer: Callable[[], object] | None = None) -> None:  # fmt: skip
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix,
                         initializer=initializer)  # fmt: skip
        self._count_lock = threading.Lock()
        self.in_flight = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> futures.Future:
        with self._count_lock:
            self.in_flight += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: futures.Future | None) -> None:
        with self._count_lock:
            self.in_flight -= 1


class Admission:
    """Admits a call while the pool holds fewer than `limit`. Refusals run on a pool of
    their own, so they are answered at once even while every handler thread is busy."""

    def __init__(self, pool: CountingExecutor, limit: int) -> None:
        self.pool = pool
        self.limit = max(1, int(limit))
        self.refusals = futures.ThreadPoolExecutor(2, thread_name_prefix="rpc-refuse")

    def admit(self) -> bool:
        return self.pool.in_flight < self.limit

    def message(self) -> str:
        return (
            f"the server is handling its limit of {self.limit} concurrent calls; retry after "
            "the seconds of retry-after (a gRPC trailer, an HTTP header), or send fewer calls "
            "at once"
        )

    def close(self) -> None:
        self.refusals.shutdown(wait=False)
