"""The standard health service's state: SERVING until shutdown and, with a PostgreSQL
store, following this server's replica."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from grpc_health.v1 import health, health_pb2


class HealthState:
    """Health at shutdown; with a PostgreSQL store it also follows the replica: the store's
    services are NOT_SERVING while this server cannot reach PostgreSQL or lags behind."""

    def __init__(self, servicer: health.HealthServicer, replica: Any = None,
                 services: Sequence[str] = ()) -> None:
        self._s = servicer
        self._stop = threading.Event()
        if replica is not None:
            threading.Thread(
                target=self._follow, args=(replica, services), name="health", daemon=True
            ).start()

    def _follow(self, replica: Any, services: Sequence[str]) -> None:
        last = None
        while not self._stop.wait(0.25):
            ok = replica.healthy()
            if ok != last:
                state = (health_pb2.HealthCheckResponse.SERVING if ok
                         else health_pb2.HealthCheckResponse.NOT_SERVING)
                for name in services:
                    self._s.set(name, state)
                last = ok

    def close(self) -> None:
        self._stop.set()
        self._s.enter_graceful_shutdown()
