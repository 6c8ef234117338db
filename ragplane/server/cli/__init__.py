"""The `ragplane` command: serve, config, admin (over gRPC), ingest, shadow, self-hosted.

Each module exports its own Typer app; this one only assembles them.
"""

from __future__ import annotations

import typer

from ragplane.server.cli.admin import admin_app
from ragplane.server.cli.ingest import ingest
from ragplane.server.cli.local import config_app, serve
from ragplane.server.cli.shadow import self_hosted_app, shadow_app

app = typer.Typer(
    help="ragplane: embeddings, durable vector collections, search, agent memory.",
    no_args_is_help=True,
    add_completion=False,
)
app.command()(serve)
app.add_typer(config_app, name="config")
app.add_typer(admin_app, name="admin")
app.command()(ingest)
app.add_typer(shadow_app, name="shadow")
app.add_typer(self_hosted_app, name="self-hosted")


def main() -> None:
    app(prog_name="ragplane")


__all__ = ["app", "main"]
