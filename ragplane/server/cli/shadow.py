"""`ragplane shadow ...` and `ragplane self-hosted ...`: evidence, gates and flips of the
shadow embedders of a running server, and the registry of declared pairs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.table import Table

from ragplane.server.cli.common import Conn, call, conn_of, connect, console, err
from ragplane.server.cli.releases import find_pairs, record_release, registry_lines
from ragplane.v1 import admin_pb2

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
        + (f" · hardware {c.hardware}" if c.hardware else "")
        + (f" · kernel {c.kernel}" if c.kernel else "")
    )
    watch_title = f"the watch of {c.shadow} (its record while it served)"
    for title, rows in (("gates", c.gates), (watch_title, c.watch)):
        if not rows:  # no gates while the shadow does not run; no watch before a flip
            continue
        gates = Table(show_header=True, title=title)
        for col in ("gate", "result", "value", "still missing"):
            gates.add_column(col)
        for g in rows:
            ok = "[green]pass[/]" if g.passed else "[red]fail[/]"
            gates.add_row(g.name, ok, g.value, g.missing)
        console.print(gates)
    if c.barred:
        console.print(f"[bold red]barred:[/] the watch of {c.shadow} failed: {c.barred}")
    _print_classes(c)
    for title, releases in (
        ("evidence per shadow release", c.releases),
        ("the watch per release (while it served)", c.watch_releases),
    ):
        _print_releases(title, releases)
    if c.reason:
        console.print(f"[bold yellow]shadow not running:[/] {c.reason}")
    console.print(f"flip-eligible: {'[green]yes[/]' if c.flip_eligible else 'no'}")
    for h in c.history:
        console.print(
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h.at))} {h.action} "
            f"-> {h.serving}{' (forced)' if h.forced else ''} {h.reason}"
        )


def _print_releases(title: str, releases) -> None:
    if releases:
        rel = Table(title=title)
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
            "offered: sampled / busy skipped / dropped",
            "G1",
            "G2",
        ):
            rel.add_column(col)
        for r in releases:
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
                f"{r.batches} = {r.sampled} / {r.skipped_busy} / {r.dropped}",
                "pass" if r.passed_g1 else "fail",
                "pass" if r.passed_g2 else "fail",
            )
        console.print(rel)


def _print_classes(c) -> None:
    """The current release's evidence per traffic class: what the gates judge."""
    cur = next((r for r in c.releases if r.shadow == c.shadow and r.hardware == c.hardware), None)
    if cur is None or not cur.classes:
        return
    t = Table(
        title=f"{cur.shadow} per traffic class ({cur.seconds / 3600:.2f} h of observed shadow time)"
    )
    for col in ("class", "share", "vectors", "cos min", "cos mean", "time ratio", "upper 95%",
                "A/A", "timed", "errors", "sampled (busy)", "skipped busy", "dropped", "judged",
                "G1", "G2"):  # fmt: skip
        t.add_column(col)
    for k in cur.classes:
        t.add_row(
            k.name, f"{k.share:.0%}", f"{k.samples:,}", f"{k.cosine_min:.6f}",
            f"{k.cosine_mean:.7f}", f"{k.time_ratio:.3f}", f"{k.time_ratio_upper:.3f}",
            f"{k.aa_time_ratio:.3f}", str(k.timed_batches), str(k.errors),
            f"{k.sampled} ({k.busy_sampled})", str(k.skipped_busy), str(k.dropped),
            "yes" if k.carried else "no", "pass" if k.passed_g1 else "fail",
            "pass" if k.passed_g2 else "fail",
        )  # fmt: skip
    console.print(t)


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
    live, source = _live_cases(conn_of(ctx))
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
        lines += _case_section(name, cfg, live.get(name))
    lines += registry_lines(koder_path, pairs)
    out.write_text("\n".join(lines) + "\n")
    console.print(f"wrote {out} ({len(pairs)} pair(s); {source})")


def _live_cases(conn: Conn) -> tuple[dict[str, admin_pb2.ShadowCase], str]:
    """The server's shadow cases by use case (empty when it does not answer), and a line
    saying where the evidence came from."""
    try:
        r = conn.stub().ShadowStatus(
            admin_pb2.ShadowStatusRequest(), timeout=conn.timeout, metadata=conn.metadata
        )
    except grpc.RpcError as exc:
        return {}, (
            f"no live evidence: the server at {conn.addr} did not answer "
            f"({exc.code().name}); declared pairs only"
        )
    return {c.use_case: c for c in r.cases}, f"live evidence from the server at {conn.addr}"


def _case_section(name: str, cfg: Any, c: admin_pb2.ShadowCase | None) -> list[str]:
    """The registry's markdown section of one declared pair."""
    g = cfg.gates
    lines = [
        "",
        f"## {name}",
        "",
        f"Gates, per traffic class carrying >= {g.min_class_share:.0%} of batches: G1 min "
        f"cosine >= {g.min_cosine}, mean >= {g.mean_cosine}, no errors, overlap@10 >= "
        f"{g.min_overlap} (after {g.min_samples} vectors, {g.min_probes} probes); G2 time "
        f"ratio upper bound <= {g.max_time_ratio}, the canonical's A/A floor not shown "
        f"(95%) above {g.max_aa_ratio}x the shadow's B/B "
        f"(after {g.min_timed_batches} timed batches); G3 {g.min_releases} releases measured "
        f"against the same canonical on the same hardware class, each over "
        f"{g.min_release_hours:g} h and {g.min_release_batches} batches of shadow traffic.",
        "",
    ]
    if c is None or c.reason:
        lines.append(
            "No evidence: the shadow is not running for this case on that server"
            + (f" ({c.reason})." if c is not None else ".")
        )
        return lines
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
    if c.watch:
        lines += ["", "Watch since the flip:", ""]
        lines += [f"- {x.name}: {'pass' if x.passed else 'fail'}: {x.value}" for x in c.watch]
    if c.history:
        lines += ["", "Flip history:", ""]
        lines += [
            f"- {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h.at))} {h.action} "
            f"-> {h.serving}{' (forced)' if h.forced else ''}: {h.reason}"
            for h in c.history
        ]
    return lines


__all__ = ["self_hosted_app", "shadow_app"]
