"""`ragplane shadow record-release`: the live G1/G2 evidence of the shadow release a running
server runs now becomes that release's entry in the committed release history
(self-hosted-releases.json beside koder.toml), which G3 counts. Kept apart from the
other shadow commands so the history's commands and rendering live in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from core.errors import InvalidArgument, RagplaneError
from ragplane.v1 import admin_pb2
from server.cli.common import call, console, err
from server.conversions import release_evidence_from_pb
from server.shadow.config import AUTO, PairConfig, discover_koder_toml, load_pairs
from server.shadow.evidence import passes_g1, passes_g2
from server.shadow.releases import (
    FILE_NAME,
    ReleaseHistory,
    history_beside,
    record_from,
    render_markdown,
)
from server.shadow.types import ReleaseEvidence

EXIT_REFUSED = 3  # the evidence does not pass G1/G2 and --allow-failing was not given


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


def failing_reasons(ev: ReleaseEvidence, cfg: PairConfig) -> list[str]:
    """Why `ev` would not count for G3 under the declared gates, with the numbers."""
    g, out = cfg.gates, []
    if not passes_g1(ev, g):
        out.append(
            f"G1: n={ev.samples} (>= {g.min_samples}), min cos {ev.cosine_min:.7f} "
            f"(>= {g.min_cosine}), mean {ev.cosine_mean:.7f} (>= {g.mean_cosine}), "
            f"overlap@10 {ev.overlap_at_10:.3f} over {ev.probes} probes "
            f"(>= {g.min_overlap} over >= {g.min_probes})"
        )
    if not passes_g2(ev, g):
        out.append(
            f"G2: time ratio {ev.time_ratio:.3f}, upper 95% {ev.time_ratio_upper:.3f} "
            f"(<= {g.max_time_ratio}) over {ev.timed_batches} timed batches "
            f"(>= {g.min_timed_batches})"
        )
    if ev.errors:
        out.append(f"{ev.errors} shadow error(s)")
    return out


def record_release(
    ctx: typer.Context,
    use_case: Annotated[str, typer.Argument()] = "embeddings",
    koder_toml: Annotated[
        str, typer.Option(help="The pairs (their gates judge the evidence); auto = discover.")
    ] = AUTO,
    history: Annotated[
        Path | None, typer.Option(help=f"The history file; default {FILE_NAME} beside koder.toml.")
    ] = None,
    allow_failing: Annotated[
        bool, typer.Option(help="Record evidence that fails G1/G2 too (G3 will not count it).")
    ] = False,
    machine: Annotated[
        str, typer.Option(help="Describe the measuring machine; default: this one.")
    ] = "",
) -> None:
    """Record the running server's live evidence for USE_CASE's current shadow release in the
    release history (re-recording a version replaces its entry). Refused, exit 3, when the
    evidence fails G1 or G2 under koder.toml's gates, unless --allow-failing."""
    path, pairs = find_pairs(koder_toml)
    cfg = pairs.get(use_case)
    if cfg is None:
        err.print(f"[bold red]error:[/] {path} declares no [self_hosted.{use_case}]")
        raise typer.Exit(2)
    (case,) = call(ctx, "ShadowStatus", admin_pb2.ShadowStatusRequest(use_case=use_case)).cases
    if case.reason:
        err.print(f"[bold red]error:[/] the shadow of {use_case} does not run: {case.reason}")
        raise typer.Exit(2)
    live = next((r for r in case.releases if r.shadow == case.shadow), None)
    if live is None:
        err.print(f"[bold red]error:[/] no live evidence for {case.shadow} yet; send traffic")
        raise typer.Exit(2)
    rec = record_from(use_case, release_evidence_from_pb(live), case.canonical, cfg.gates, machine)
    why = failing_reasons(rec.evidence, cfg)
    if why and not allow_failing:
        err.print(f"[bold red]refused:[/] {rec.shadow} does not pass under {path.name}'s gates:")
        for line in why:
            err.print(f"  {line}")
        err.print("record it anyway with --allow-failing (G3 will not count it)")
        raise typer.Exit(EXIT_REFUSED)
    target = ReleaseHistory(history) if history else history_beside(path)
    try:
        replaced = target.record(rec)
    except RagplaneError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(
        f"{'replaced' if replaced else 'recorded'} {rec.shadow} ({use_case}) in {target.path}"
        + (f"; failing, not counted by G3: {'; '.join(why)}" if why else "; G3 counts it")
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
        f"From `{FILE_NAME}` (committed; `ragplane shadow record-release` adds the live "
        "release). G3 counts the entries that pass G1 and G2 under the case's gates today "
        "with no errors, plus the live release when it passes now.",
        "",
        *render_markdown(records, {name: cfg.gates for name, cfg in pairs.items()}),
    ]
