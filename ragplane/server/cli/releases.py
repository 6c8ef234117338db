"""`ragplane shadow record-release`: the running server that measured the shadow release
it runs now records that release's live evidence, under its own gates, in its release
history (self-hosted-releases.json beside koder.toml), which G3 counts. Kept apart from
the other shadow commands so the history's commands and rendering live in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import grpc
import typer

from ragplane.core.errors import InvalidArgument, RagplaneError
from ragplane.server.cli.common import conn_of, console, err, errors
from ragplane.server.shadow.config import AUTO, PairConfig, discover_koder_toml, load_pairs
from ragplane.server.shadow.releases import FILE_NAME, history_beside, render_markdown
from ragplane.v1 import admin_pb2

EXIT_REFUSED = 3  # the server refused: the release fails G1/G2 or had errors


def find_pairs(koder_toml: str) -> tuple[Path, dict[str, PairConfig]]:
    """The koder.toml to use (auto = discover as the server does) and its pairs."""
    try:
        path = discover_koder_toml(koder_toml or AUTO)
        if path is None:
            raise InvalidArgument("no koder.toml found; pass --koder-toml")
        return path, load_pairs(path)
    except RagplaneError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None


def record_release(
    ctx: typer.Context, use_case: Annotated[str, typer.Argument()] = "embeddings"
) -> None:
    """Ask the running server to record its live evidence for USE_CASE's current shadow
    release in its release history (re-recording a version replaces its entry). The server
    judges it under its own gates and refuses (exit 3, with every reason) a release that
    fails G1 or G2 or had a shadow error."""
    conn = conn_of(ctx)
    try:
        r = conn.stub().RecordRelease(
            admin_pb2.RecordReleaseRequest(use_case=use_case),
            timeout=conn.timeout,
            metadata=conn.metadata,
        )
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            with errors(conn):
                raise
        err.print(f"[bold red]refused:[/] {exc.details()}")
        raise typer.Exit(EXIT_REFUSED) from None
    ev = r.evidence
    console.print(
        f"{'replaced' if r.replaced else 'recorded'} {ev.shadow} ({use_case}) in {r.history}: "
        f"against {ev.canonical} on {ev.hardware}, {ev.seconds / 3600:.2f} h of observed "
        f"shadow time, {ev.compared} compared batches, measured on {r.machine}; signed by key "
        f"{r.key_id} (G3 counts it where koder.toml's [release_keys] trusts that key)"
    )


def registry_lines(koder_toml: Path, pairs: dict[str, PairConfig]) -> list[str]:
    """The release-history section of self-hosted-pairs.md."""
    history = history_beside(koder_toml)
    try:
        records = history.records()
    except RagplaneError as exc:
        return ["", "## Release history", "", f"Unreadable: {exc}"]
    return [
        "",
        "## Release history",
        "",
        f"From `{FILE_NAME}` (committed; `ragplane shadow record-release` asks the server "
        "that measured a release to add it). G3 counts an entry only when it was measured "
        "against the canonical and on the hardware class of the decision at hand, over the "
        "minimum observed shadow time and compared batches, and passes G1 and G2 per traffic "
        "class under the case's gates today with no errors, and only when it is signed by a "
        "key koder.toml's [release_keys] trusts; the live release counts when it does so now.",
        "",
        *render_markdown(records, {name: cfg.gates for name, cfg in pairs.items()}),
    ]
