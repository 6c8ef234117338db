"""`ragplane shadow ...` and `ragplane self-hosted ...`: evidence, gates and flips of the
shadow embedders of a running server, and the registry of declared pairs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import grpc
import typer
from rich.table import Table

from ragplane.v1 import admin_pb2
from server.cli.common import call, conn_of, connect, console, err
from server.cli.releases import find_pairs, record_release, registry_lines

shadow_app = typer.Typer(help="Shadow embedders: evidence, gates, flip.", no_args_is_help=True)
self_hosted_app = typer.Typer(
    help="Self-hosted-first pairs declared in koder.toml.", no_args_is_help=True
)
shadow_app.callback()(connect)
shadow_app.command("record-release")(record_release)
self_hosted_app.callback()(connect)


def _print_case(c) -> None:
    console.print(
        f"[bold]{c.use_case}[/]: {c.status} · policy {c.policy} · sample rate "
        f"{c.sample_rate:g} · serving [cyan]{c.serving}[/] · canonical {c.canonical} "
        f"· shadow {c.shadow}"
    )
    gates = Table(show_header=True)
    for col in ("gate", "result", "value", "still missing"):
        gates.add_column(col)
    for g in c.gates:
        gates.add_row(g.name, "[green]pass[/]" if g.passed else "[red]fail[/]", g.value, g.missing)
    if c.gates:  # none while the shadow does not run
        console.print(gates)
    if c.releases:
        rel = Table(title="evidence per shadow release")
        for col in (
            "release",
            "samples",
            "cos min",
            "cos p1",
            "cos mean",
            "overlap@10 (probes)",
            "time ratio (ub, batches)",
            "A/A",
            "errors",
            "dropped",
            "G1",
            "G2",
        ):
            rel.add_column(col)
        for r in c.releases:
            rel.add_row(
                r.shadow,
                f"{r.samples:,}",
                f"{r.cosine_min:.6f}",
                f"{r.cosine_p1:.6f}",
                f"{r.cosine_mean:.7f}",
                f"{r.overlap_at_10:.3f} ({r.probes})",
                f"{r.time_ratio:.3f} ({r.time_ratio_upper:.3f}, {r.timed_batches})",
                f"{r.aa_time_ratio:.3f}",
                str(r.errors),
                str(r.dropped),
                "pass" if r.passed_g1 else "fail",
                "pass" if r.passed_g2 else "fail",
            )
        console.print(rel)
    if c.reason:
        console.print(f"[bold yellow]shadow not running:[/] {c.reason}")
    console.print(f"flip-eligible: {'[green]yes[/]' if c.flip_eligible else 'no'}")
    for h in c.history:
        console.print(
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h.at))} {h.action} "
            f"-> {h.serving}{' (forced)' if h.forced else ''} {h.reason}"
        )


@shadow_app.command("status")
def shadow_status(
    ctx: typer.Context, use_case: Annotated[str | None, typer.Argument()] = None
) -> None:
    """Agreement, throughput and gate status per case-of-use."""
    r = call(ctx, "ShadowStatus", admin_pb2.ShadowStatusRequest(use_case=use_case or ""))
    for c in r.cases:
        _print_case(c)


@shadow_app.command("flip")
def shadow_flip(ctx: typer.Context, use_case: str, force: bool = False) -> None:
    """Make the shadow embedder answer USE_CASE (refused unless every gate holds, or --force)."""
    r = call(ctx, "Flip", admin_pb2.FlipRequest(use_case=use_case, force=force))
    _print_case(r.case)


@shadow_app.command("unflip")
def shadow_unflip(ctx: typer.Context, use_case: str) -> None:
    """Return USE_CASE to the canonical embedder, at once."""
    r = call(ctx, "Unflip", admin_pb2.UnflipRequest(use_case=use_case))
    _print_case(r.case)


@self_hosted_app.command("registry")
def registry(
    ctx: typer.Context,
    koder_toml: Annotated[
        str, typer.Option(help="The pairs' declarations; auto = discover as the server does.")
    ] = "auto",
    out: Annotated[Path, typer.Option(help="Where to write the registry.")] = Path(
        "self-hosted-pairs.md"
    ),
) -> None:
    """Write every declared pair, its status, each gate's value and the evidence behind it
    (from the running server when it answers) as markdown."""
    koder_path, pairs = find_pairs(koder_toml)
    if not pairs:
        err.print(f"[bold red]error:[/] {koder_path} declares no [self_hosted.<case>] pairs")
        raise typer.Exit(1)
    conn = conn_of(ctx)
    live: dict[str, admin_pb2.ShadowCase] = {}
    source = f"live evidence from the server at {conn.addr}"
    try:
        r = conn.stub().ShadowStatus(
            admin_pb2.ShadowStatusRequest(), timeout=conn.timeout, metadata=conn.metadata
        )
        live = {c.use_case: c for c in r.cases}
    except grpc.RpcError as exc:
        source = (
            f"no live evidence: the server at {conn.addr} did not answer "
            f"({exc.code().name}); declared pairs only"
        )
    lines = [
        "# Self-hosted pairs",
        "",
        f"Generated by `ragplane self-hosted registry` from `{koder_path.name}` at "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {source}.",
        "",
        "| use case | canonical | shadow | status | policy | sample rate | serving | "
        "flip-eligible |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, cfg in sorted(pairs.items()):
        c = live.get(name)
        lines.append(
            f"| {name} | {c.canonical if c else cfg.canonical} | {c.shadow if c else cfg.shadow}"
            f" | {c.status if c else cfg.status} | {cfg.policy} | {cfg.sample_rate:g} | "
            f"{c.serving if c else '-'} | {('yes' if c.flip_eligible else 'no') if c else '-'} |"
        )
    for name, cfg in sorted(pairs.items()):
        g = cfg.gates
        lines += [
            "",
            f"## {name}",
            "",
            f"Gates: G1 min cosine >= {g.min_cosine}, mean >= {g.mean_cosine}, "
            f"overlap@10 >= {g.min_overlap} (after {g.min_samples} vectors, "
            f"{g.min_probes} probes); G2 time ratio upper bound <= {g.max_time_ratio} "
            f"(after {g.min_timed_batches} timed batches); G3 {g.min_releases} releases.",
            "",
        ]
        c = live.get(name)
        if c is None:
            lines.append("No evidence: the shadow is not running for this case on that server.")
            continue
        lines += ["| gate | result | value | still missing |", "| --- | --- | --- | --- |"]
        lines += [
            f"| {x.name} | {'pass' if x.passed else 'fail'} | {x.value} | {x.missing or '-'} |"
            for x in c.gates
        ]
        if c.releases:
            lines += [
                "",
                "| release | samples | cos min | cos p1 | cos mean | overlap@10 | probes | "
                "time ratio | upper 95% | timed batches | A/A | errors | dropped |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            lines += [
                f"| {r.shadow} | {r.samples} | {r.cosine_min:.6f} | {r.cosine_p1:.6f} | "
                f"{r.cosine_mean:.7f} | {r.overlap_at_10:.3f} | {r.probes} | "
                f"{r.time_ratio:.3f} | {r.time_ratio_upper:.3f} | {r.timed_batches} | "
                f"{r.aa_time_ratio:.3f} | {r.errors} | {r.dropped} |"
                for r in c.releases
            ]
        if c.history:
            lines += ["", "Flip history:", ""]
            lines += [
                f"- {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h.at))} {h.action} "
                f"-> {h.serving}{' (forced)' if h.forced else ''}: {h.reason}"
                for h in c.history
            ]
    lines += registry_lines(koder_path, pairs)
    out.write_text("\n".join(lines) + "\n")
    console.print(f"wrote {out} ({len(pairs)} pair(s); {source})")


__all__ = ["self_hosted_app", "shadow_app"]
