"""The standard health service's state: SERVING until shutdown and, with a PostgreSQL
store shared by many servers, following this server's place in it (its `Follower`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from grpc_health.v1 import health, health_pb2

from ragplane.index.backend import Follower
from ragplane.server.grpc_loop import LoopServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthState:
    """Every service in `serving` SERVING from the start until shutdown; with a shared
    store, the store's `services` are NOT_SERVING while this server cannot reach the store
    or lags behind. The servicer is gRPC's aio one: its state changes run on the server's
    event loop."""

    def __init__(
        self,
        servicer: health.aio.HealthServicer,
        server: LoopServer,
        serving: Sequence[str],
        follower: Follower | None = None,
        services: Sequence[str] = (),
    ) -> None:
        self._s = servicer
        self._server = server
        self._stop = threading.Event()
        for name in serving:
            server.call(servicer.set(name, SERVING))
        if follower is not None:
            threading.Thread(
                target=self._follow, args=(follower, services), name="health", daemon=True
            ).start()

    def _follow(self, follower: Follower, services: Sequence[str]) -> None:
        last = None
        while not self._stop.wait(0.25):
            ok = follower.healthy()
            if ok != last:
                for name in services:
                    self._server.soon(self._s.set(name, SERVING if ok else NOT_SERVING))
                last = ok

    def close(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._server.soon(self._s.enter_graceful_shutdown())
