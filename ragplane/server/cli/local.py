"""`ragplane serve` and `ragplane config ...`: the commands that work on this machine's
settings rather than on a running server."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.table import Table

from ragplane.core.errors import RagplaneError
from ragplane.server.cli.common import console, err
from ragplane.server.settings import Settings

config_app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True)

ConfigOpt = Annotated[str | None, typer.Option("--config", help="TOML settings file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Any setting as FIELD=VALUE (repeatable); see `config show`."),
]


def _settings(config: str | None, sets: list[str] | None, **flags) -> Settings:
    overrides = {k: v for k, v in flags.items() if v is not None}
    for item in sets or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise typer.BadParameter(f"--set {item!r}: expected FIELD=VALUE")
        overrides[key.strip().replace("-", "_")] = value
    return Settings.load(overrides, config_file=config)


def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="gRPC port (0 = any free).")] = None,
    data_dir: Annotated[str | None, typer.Option(help="Data directory.")] = None,
    store: Annotated[
        str | None,
        typer.Option(help="sqlite (embedded, the default) | postgresql://user@host:port/db"),
    ] = None,
    embedder: Annotated[
        str | None, typer.Option(help="auto | sentence-transformers | onnx | embedder_rs | fake")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Prometheus port (0 = off).")] = None,
    http_port: Annotated[
        int | None, typer.Option(help="OpenAI-compatible HTTP port (0 = off).")
    ] = None,
    koder_toml: Annotated[
        str | None, typer.Option(help="Shadow pairs: auto | a koder.toml path | '' (none).")
    ] = None,
    log_json: Annotated[bool | None, typer.Option("--log-json/--no-log-json")] = None,
    set_: SetOpt = None,
) -> None:
    """Start the gRPC server (SQLite + FAISS in this process, or a PostgreSQL store shared
    by many servers with --store), and the OpenAI-compatible HTTP API when --http-port is
    set, until SIGTERM."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from ragplane.server import logs
    from ragplane.server.app import serve as run

    try:
        settings = _settings(
            config,
            set_,
            host=host,
            port=port,
            data_dir=data_dir,
            store=store,
            embedder=embedder,
            device=device,
            metrics_port=metrics_port,
            http_port=http_port,
            koder_toml=koder_toml,
            log_json=log_json,
        )
        logs.setup(settings.log_level, settings.log_json)
        run(settings)
    except RagplaneError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None


@config_app.command("show")
def config_show(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the effective settings (defaults < file < RAGPLANE_* env < flags), secrets redacted."""
    try:
        settings = _settings(config, set_)
    except RagplaneError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    values = settings.redacted()
    if as_json:
        import json

        print(json.dumps(values, indent=2))
        return
    table = Table(title="ragplane settings", show_lines=False)
    table.add_column("setting", style="bold")
    table.add_column("value")
    table.add_column("why it matters", style="dim")
    docs = Settings.docs()
    for name, value in values.items():
        table.add_row(name, str(value), docs[name])
    console.print(table)
