"""The gRPC server on an asyncio event loop (`grpc.aio`), driven from synchronous code.

Why aio: gRPC's threaded server hands a unary call across four threads (the poller gives
it to a worker, the worker waits for the poller to read the message, sends, the poller
completes), and under load its threads spend more time passing the GIL than working. On
the event loop a call is received, checked and answered on one thread; only the servicer's
own work crosses to the handler pool and back (`in_pool`). BENCHMARKS.md section 19 has
the measurement.

`LoopServer` runs the loop on a thread of its own and offers what the rest of ragplane
used of `grpc.Server`: ports, `start()`, `stop(grace)` returning an event to wait on.
`CallContext` is what a servicer (synchronous code on a pool thread) sees of its call.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc

T = TypeVar("T")


class Aborted(Exception):
    """`CallContext.abort` on a pool thread: the interceptor ends the call with its status
    on the event loop (gRPC's aio abort is a coroutine of the loop)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class CallContext:
    """A call as its servicer sees it from a pool thread: the calls of `grpc.ServicerContext`
    ragplane makes, answered from the aio context without waiting for the loop."""

    __slots__ = ("_context", "closed")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.closed = False  # the client went away or the call was cancelled

    def is_active(self) -> bool:
        if self.closed:
            return False
        left = self._context.time_remaining()
        return left is None or left > 0

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self._context.invocation_metadata() or ()

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._context.set_trailing_metadata(tuple(metadata))

    def peer(self) -> str:
        return self._context.peer()

    def auth_context(self) -> dict[str, Any]:
        return self._context.auth_context()

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)


async def in_pool(pool: futures.Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on `pool`, in a copy of this task's context variables (request id,
    principal), so logs and scope checks on the pool thread see the call's own."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, contextvars.copy_context().run, fn, *args)


def blocking_iter(messages: Any, loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    """A streamed request's messages (an async iterator of the loop) as a plain iterator
    for a servicer on a pool thread; each message is read on the loop."""
    it: AsyncIterator[Any] = messages.__aiter__()

    async def next_message() -> Any:
        return await it.__anext__()

    while True:
        try:
            yield asyncio.run_coroutine_threadsafe(next_message(), loop).result()
        except StopAsyncIteration:
            return


class LoopServer:
    """A `grpc.aio.Server` on an event loop of its own thread. Register services on `.aio`;
    `start()` and `stop(grace)` behave like the threaded server's."""

    def __init__(
        self,
        *,
        interceptors: Sequence[grpc.aio.ServerInterceptor],
        options: Sequence[tuple[str, Any]],
        pool: futures.Executor,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="grpc-loop", daemon=True)
        self._thread.start()

        async def create() -> grpc.aio.Server:
            # created on its loop: gRPC binds an aio server to the loop running it
            return grpc.aio.server(
                migration_thread_pool=pool, interceptors=interceptors, options=options
            )

        self.aio: grpc.aio.Server = self.call(create())

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def soon(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` on the server's loop without waiting; nothing once the loop is gone."""
        if not self.loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(coro, self.loop)
                return
            except RuntimeError:  # closed between the check and the call
                pass
        coro.close()

    def add_insecure_port(self, address: str) -> int:
        async def add() -> int:
            return self.aio.add_insecure_port(address)

        return self.call(add())

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        async def add() -> int:
            return self.aio.add_secure_port(address, credentials)

        return self.call(add())

    def start(self) -> None:
        self.call(self.aio.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Refuse new calls, give those in flight `grace` seconds, then end the loop; the
        event is set once the loop has stopped."""
        done = threading.Event()
        if self.loop.is_closed():
            done.set()
            return done

        async def stop() -> None:
            try:
                await self.aio.stop(grace)
            finally:
                self.loop.call_soon(self.loop.stop)

        def finished(_future: Any) -> None:
            self._thread.join()
            done.set()

        try:
            future = asyncio.run_coroutine_threadsafe(stop(), self.loop)
        except RuntimeError:  # the loop stopped already
            done.set()
            return done
        future.add_done_callback(lambda f: threading.Thread(target=finished, args=(f,)).start())
        return done
