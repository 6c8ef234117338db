"""What every remote sub-command shares: the connection (one channel per command, closed
when the command ends, kept in the Typer context) and one way to report gRPC failures."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.console import Console

from ragplane.v1 import admin_pb2_grpc

console = Console()
err = Console(stderr=True)


@dataclass
class Conn:
    """Where and how to reach the server. The channel opens on first use."""

    addr: str
    key: str
    tls_ca: str
    timeout: float
    _channel: grpc.Channel | None = field(default=None, repr=False)

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            # room for a bulk write's batch of vectors (the server's default limit)
            opts = [("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20)]
            if self.tls_ca:
                creds = grpc.ssl_channel_credentials(Path(self.tls_ca).read_bytes())
                self._channel = grpc.secure_channel(self.addr, creds, options=opts)
            else:
                self._channel = grpc.insecure_channel(self.addr, options=opts)
        return self._channel

    def stub(self) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self.channel())

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    @property
    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.key}")] if self.key else []


def connect(
    ctx: typer.Context,
    addr: Annotated[str, typer.Option(envvar="RAGPLANE_ADDR", help="Server address.")] = (
        "127.0.0.1:50051"
    ),
    key: Annotated[
        str,
        typer.Option(envvar="RAGPLANE_API_KEY", help="API key (admin scope).", show_default=False),
    ] = "",
    tls_ca: Annotated[
        str, typer.Option(envvar="RAGPLANE_TLS_CA", help="CA bundle to verify a TLS server.")
    ] = "",
    timeout: Annotated[float, typer.Option(help="Seconds per call (rebuilds excepted).")] = 30.0,
) -> None:
    """The callback of every remote command group: puts a `Conn` in the context."""
    conn = Conn(addr, key, tls_ca, timeout)
    ctx.obj = conn
    ctx.call_on_close(conn.close)


def conn_of(ctx: typer.Context) -> Conn:
    conn = ctx.find_object(Conn)
    if conn is None:  # a command invoked without its group's callback: a bug of ours
        raise RuntimeError("no connection in the command's context")
    return conn


@contextlib.contextmanager
def errors(conn: Conn, scope: str = "admin", exit_code: int = 1,
           before: Callable[[], Any] | None = None) -> Iterator[None]:
    """Turn gRPC failures into one readable line and exit `exit_code`; `before` runs first
    (a command's summary of what it did before the failure)."""
    try:
        yield
    except grpc.RpcError as exc:
        if before is not None:
            before()
        code = exc.code()
        hint = {
            grpc.StatusCode.UNAVAILABLE: f"cannot reach ragplane at {conn.addr}: is the server "
            "running (`ragplane serve`) and is --addr right?",
            grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer from {conn.addr} within "
            f"{conn.timeout:.0f}s; retry with a larger --timeout",
            grpc.StatusCode.UNAUTHENTICATED: f"{exc.details()}; pass --key or set RAGPLANE_API_KEY",
            grpc.StatusCode.PERMISSION_DENIED: f"{exc.details()}; use a key with the {scope} scope",
        }.get(code, exc.details())
        err.print(f"[bold red]error[/] ({code.name}): {hint}")
        raise typer.Exit(exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted (a rebuild goes on in the server)")
        raise typer.Exit(130) from None


def call(ctx: typer.Context, name: str, request: Any) -> Any:
    """One unary AdminService call with the context's connection, failures reported."""
    conn = conn_of(ctx)
    with errors(conn):
        return getattr(conn.stub(), name)(request, timeout=conn.timeout, metadata=conn.metadata)
