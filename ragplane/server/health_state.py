"""The standard health service's state: SERVING until shutdown and, with a PostgreSQL
store shared by many servers, following this server's place in it (its `Follower`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from grpc_health.v1 import health, health_pb2

from ragplane.index.backend import Follower


class HealthState:
    """Health at shutdown; with a shared store it also follows the follower: the store's
    services are NOT_SERVING while this server cannot reach the store or lags behind."""

    def __init__(self, servicer: health.HealthServicer, follower: Follower | None = None,
                 services: Sequence[str] = ()) -> None:
        self._s = servicer
        self._stop = threading.Event()
        if follower is not None:
            threading.Thread(
                target=self._follow, args=(follower, services), name="health", daemon=True
            ).start()

    def _follow(self, follower: Follower, services: Sequence[str]) -> None:
        last = None
        while not self._stop.wait(0.25):
            ok = follower.healthy()
            if ok != last:
                state = (health_pb2.HealthCheckResponse.SERVING if ok
                         else health_pb2.HealthCheckResponse.NOT_SERVING)
                for name in services:
                    self._s.set(name, state)
                last = ok

    def close(self) -> None:
        self._stop.set()
        self._s.enter_graceful_shutdown()
