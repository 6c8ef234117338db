"""uvicorn serving the OpenAI-compatible API (`ragplane.server.openai_http`) and the
operator's console (`ragplane.server.console`, under /console) on a thread and event loop
of its own, started by `create_server` and stopped with the gRPC server.

The socket is bound here, before the thread starts, so a taken port fails the start at
once (as the gRPC port does) and the bound port is known. With TLS settings the API is
served over HTTPS with the gRPC server's certificate (and its client CA: mutual TLS), so an
API key never crosses the network in the clear on one transport but not the other.
On stop, `drain()` turns new calls away (503) and closes the listener while in-flight calls
finish, for up to `grace_seconds`, alongside the gRPC drain; `close()` waits for that.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import threading
import time

import uvicorn
from starlette.routing import Mount

from ragplane.core.errors import InvalidArgument, Unavailable
from ragplane.server.admission import Admission
from ragplane.server.auth import KeyStore
from ragplane.server.console import Console, ConsoleRuntime
from ragplane.server.embedding.service import EmbeddingService
from ragplane.server.metrics import Metrics
from ragplane.server.openai_http import OpenAIApi
from ragplane.server.settings import Settings

log = logging.getLogger(__name__)
# uvicorn's INFO lines ("Started server process", on a logger named uvicorn.error) would
# read as another server's; its warnings and errors still show. Our own line says where.
_UVICORN_LOG = logging.getLogger("uvicorn.error")


class HttpServer:
    """One uvicorn server on its own thread. `port` is the bound port."""

    def __init__(
        self,
        api: OpenAIApi,
        sock: socket.socket,
        grace_seconds: float,
        tls: dict[str, object] | None = None,
        start_timeout: float = 30.0,
        console: Console | None = None,
    ) -> None:
        self.api = api
        self.console = console
        self.port: int = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(
            api.app,
            lifespan="off",
            log_config=None,  # ragplane's logging, as set up by `ragplane serve`
            access_log=False,  # the API logs each call at DEBUG, as the gRPC interceptor
            server_header=False,
            timeout_graceful_shutdown=max(1, math.ceil(grace_seconds)),
            **(tls or {}),  # type: ignore[arg-type]
        )
        config.load()  # here, so that a bad certificate fails the start, not the thread
        self._server = uvicorn.Server(config)
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise Unavailable(f"the HTTP API did not start: {self._failed!r}")
            time.sleep(0.005)

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # uvicorn exits with SystemExit on a failed start
            self._failed = exc
            log.exception("the HTTP API stopped")

    def drain(self) -> None:
        """Refuse new calls (503), stop accepting connections, let in-flight calls finish."""
        self.api.draining = True
        self._server.should_exit = True

    def close(self, timeout: float | None = None) -> None:
        """Drain and wait for the server's thread (up to its grace, plus a second)."""
        self.drain()
        grace = self._server.config.timeout_graceful_shutdown or 0
        self._thread.join(timeout if timeout is not None else grace + 1.0)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(1.0)
        self._sock.close()
        if self.console is not None:
            self.console.close()


def serve_http(
    settings: Settings,
    embedding: EmbeddingService,
    keys: KeyStore,
    metrics: Metrics,
    admission: Admission,
    runtime: ConsoleRuntime | None = None,
) -> HttpServer:
    """The API on `settings.host`:`settings.http_port`, serving, with the operator's console
    under /console when `runtime` is given. Raises InvalidArgument when the port cannot be
    bound."""
    if _UVICORN_LOG.level == logging.NOTSET:
        _UVICORN_LOG.setLevel(logging.WARNING)
    console = Console(runtime, metrics, admission) if runtime is not None else None
    mounts = [Mount("/console", app=console.app)] if console is not None else []
    api = OpenAIApi(
        embedding, keys, metrics, admission, max_body_bytes=settings.max_message_bytes,
        mounts=mounts,
    )
    if console is not None:
        console.draining = lambda: api.draining
    sock = bind(settings.host, settings.http_port)
    tls: dict[str, object] = {}
    if settings.tls_cert:
        tls = {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
        if settings.tls_client_ca:
            tls |= {"ssl_ca_certs": settings.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    try:
        return HttpServer(api, sock, settings.grace_seconds, tls, console=console)
    except BaseException:
        sock.close()
        if console is not None:
            console.close()
        raise


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv4 or IPv6; port 0: any free one)."""
    host = host.strip("[]")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise InvalidArgument(f"cannot bind HTTP {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InvalidArgument(
            f"cannot bind HTTP {host}:{port} ({exc.strerror}); is another server using the "
            "port? set http_port (--http-port) to a free one, or 0 for no HTTP API"
        ) from None
    return sock
