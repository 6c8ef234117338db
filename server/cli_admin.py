"""`ragplane admin ...` and `ragplane shadow ...`: talk to a running server through
AdminService (never its data files behind its back), with readable tables, a progress
bar for rebuilds and errors that say what to do."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import grpc
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from ragplane.v1 import admin_pb2, admin_pb2_grpc, index_pb2
from server.cli import app

admin_app = typer.Typer(
    help="Operate a running server (needs a key with the admin scope).", no_args_is_help=True
)
keys_app = typer.Typer(help="API keys: create, list, revoke.", no_args_is_help=True)
shadow_app = typer.Typer(help="Shadow embedders: evidence, gates, flip.", no_args_is_help=True)
self_hosted_app = typer.Typer(
    help="Self-hosted-first pairs declared in koder.toml.", no_args_is_help=True
)
admin_app.add_typer(keys_app, name="keys")
app.add_typer(admin_app, name="admin")
app.add_typer(shadow_app, name="shadow")
app.add_typer(self_hosted_app, name="self-hosted")
console = Console()
err = Console(stderr=True)

METRICS = {v: k.removeprefix("METRIC_").lower() for k, v in index_pb2.Metric.items()}
INDEX_TYPES = {v: k.removeprefix("INDEX_TYPE_").lower() for k, v in index_pb2.IndexType.items()}


@dataclass
class Conn:
    addr: str
    key: str
    tls_ca: str
    timeout: float

    def stub(self) -> admin_pb2_grpc.AdminServiceStub:
        if self.tls_ca:
            creds = grpc.ssl_channel_credentials(Path(self.tls_ca).read_bytes())
            channel = grpc.secure_channel(self.addr, creds)
        else:
            channel = grpc.insecure_channel(self.addr)
        return admin_pb2_grpc.AdminServiceStub(channel)

    @property
    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.key}")] if self.key else []


_conn = Conn("127.0.0.1:50051", "", "", 30.0)


def _connect(
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
    global _conn
    _conn = Conn(addr, key, tls_ca, timeout)


admin_app.callback()(_connect)
shadow_app.callback()(_connect)
self_hosted_app.callback()(_connect)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn gRPC failures into one readable line and a non-zero exit."""
    try:
        yield
    except grpc.RpcError as exc:
        code = exc.code()
        hint = {
            grpc.StatusCode.UNAVAILABLE: f"cannot reach ragplane at {_conn.addr}: is the server "
            "running (`ragplane serve`) and is --addr right?",
            grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer from {_conn.addr} within "
            f"{_conn.timeout:.0f}s; retry with a larger --timeout",
            grpc.StatusCode.UNAUTHENTICATED: f"{exc.details()}; pass --key or set RAGPLANE_API_KEY",
            grpc.StatusCode.PERMISSION_DENIED: f"{exc.details()}; use a key with the admin scope",
        }.get(code, exc.details())
        err.print(f"[bold red]error[/] ({code.name}): {hint}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err.print("interrupted (a rebuild goes on in the server)")
        raise typer.Exit(130) from None


def _call(name: str, request):
    with _errors():
        return getattr(_conn.stub(), name)(request, timeout=_conn.timeout, metadata=_conn.metadata)


def _collections_table(colls, title: str = "collections") -> Table:
    t = Table(title=title)
    for col in ("name", "count", "tombstones", "dim", "metric", "index", "generation", "embedder"):
        t.add_column(
            col, justify="right" if col in ("count", "tombstones", "dim", "generation") else "left"
        )
    for c in colls:
        t.add_row(
            c.name,
            f"{c.count:,}",
            f"{c.tombstones:,}",
            str(c.dim),
            METRICS[c.metric],
            INDEX_TYPES[c.index_type],
            str(c.generation),
            c.embedder or "(vectors only)",
        )
    return t


@admin_app.command()
def status() -> None:
    """Collections, counts, generations, embedder identity and a shadow summary."""
    r = _call("Status", admin_pb2.StatusRequest())
    console.print(
        f"[bold]ragplane {r.version}[/] · up {r.uptime_seconds:,.0f}s · embedder "
        f"[cyan]{r.embedder}[/] · {r.memories:,} memories"
    )
    if r.collections:
        console.print(_collections_table(r.collections))
    else:
        console.print("no collections yet (create one with IndexService.CreateCollection)")
    if r.shadow:
        t = Table(title="shadow")
        for col in ("use case", "status", "serving", "shadow", "flip-eligible"):
            t.add_column(col)
        for s in r.shadow:
            t.add_row(
                s.use_case,
                s.status,
                s.serving,
                s.shadow,
                "[green]yes[/]" if s.flip_eligible else "no",
            )
        console.print(t)


@admin_app.command()
def rebuild(
    collection: str,
    index_type: Annotated[str | None, typer.Option(help="flat | hnsw | ivf_pq")] = None,
    hnsw_m: int = 0,
    hnsw_ef_construction: int = 0,
    hnsw_ef_search: int = 0,
    ivf_nlist: int = 0,
    ivf_nprobe: int = 0,
    pq_m: int = 0,
    reembed: Annotated[bool, typer.Option(help="Re-embed every item's text.")] = False,
    min_recall: Annotated[float, typer.Option(help="Refuse the swap below this recall@10.")] = 0.95,
) -> None:
    """Build a new index generation in the background, check its recall, swap it in."""
    kinds = {
        "flat": index_pb2.INDEX_TYPE_FLAT,
        "hnsw": index_pb2.INDEX_TYPE_HNSW,
        "ivf_pq": index_pb2.INDEX_TYPE_IVF_PQ,
    }
    if index_type is not None and index_type not in kinds:
        raise typer.BadParameter(
            f"{index_type!r}; use flat, hnsw or ivf_pq", param_hint="--index-type"
        )
    params = index_pb2.IndexParams(
        hnsw_m=hnsw_m,
        hnsw_ef_construction=hnsw_ef_construction,
        hnsw_ef_search=hnsw_ef_search,
        ivf_nlist=ivf_nlist,
        ivf_nprobe=ivf_nprobe,
        pq_m=pq_m,
    )
    request = admin_pb2.RebuildRequest(
        collection=collection,
        index_type=kinds.get(index_type or "", 0),
        reembed=reembed,
        min_recall=min_recall,
    )
    if any(
        getattr(params, f)
        for f in (
            "hnsw_m",
            "hnsw_ef_construction",
            "hnsw_ef_search",
            "ivf_nlist",
            "ivf_nprobe",
            "pq_m",
        )
    ):
        request.params.CopyFrom(params)
    last = None
    started = time.monotonic()
    with (
        _errors(),
        Progress(
            TextColumn("[bold]{task.fields[phase]:>9}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,.0f}/{task.fields[of]:,.0f}"),
            TextColumn("{task.fields[rate]:,.0f}/s"),
            TimeRemainingColumn(),
            console=console,
        ) as bar,
    ):
        task = bar.add_task("rebuild", total=None, phase="starting", rate=0.0, of=0)
        for p in _conn.stub().Rebuild(request, metadata=_conn.metadata):
            bar.update(
                task,
                completed=p.done,
                total=p.total or None,
                phase=p.phase,
                rate=p.rate,
                of=p.total,
            )
            last = p
    if last is None:
        err.print("[red]the server ended the rebuild without reporting progress[/]")
        raise typer.Exit(1)
    took = time.monotonic() - started
    console.print(
        f"[green]swapped[/] {collection} to generation {last.generation} "
        f"(recall@10 {last.recall:.4f}) in {took:.1f}s"
        if last.phase == "swapped"
        else f"{last.phase}: {last.message}"
    )


@admin_app.command()
def rollback(collection: str) -> None:
    """Serve the previous index generation again."""
    c = _call("Rollback", admin_pb2.RollbackRequest(collection=collection))
    console.print(f"{c.name} serves generation {c.generation} again")


@admin_app.command()
def compact(collection: Annotated[str | None, typer.Argument()] = None) -> None:
    """Drop tombstones (deleted and replaced vectors) of one or every collection."""
    r = _call("Compact", admin_pb2.CompactRequest(collection=collection or ""))
    console.print(f"removed {r.removed:,} tombstones")


@admin_app.command()
def snapshot(dir: str) -> None:
    """Write a consistent snapshot into DIR on the server's machine."""
    r = _call("Snapshot", admin_pb2.SnapshotRequest(dir=dir))
    console.print(f"snapshot of {r.bytes / 1e6:,.1f} MB written to {r.dir}")


@admin_app.command()
def restore(
    snapshot_dir: Path,
    data_dir: Annotated[Path, typer.Option(help="The (stopped) server's data directory.")] = Path(
        "./ragplane-data"
    ),
) -> None:
    """Restore a snapshot into a data directory. The server must be stopped."""
    from server.admin import AdminOps
    from server.errors import RagplaneError

    try:
        AdminOps.restore(snapshot_dir, data_dir)
    except (RagplaneError, OSError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(f"restored {snapshot_dir} into {data_dir}; start the server on it")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key acts for.")] = "default",
    scope: Annotated[list[str], typer.Option(help="read | write | admin (repeatable).")] = [  # noqa: B006
        "read",
        "write",
    ],
    description: str = "",
) -> None:
    """Create a key; its secret is shown once."""
    r = _call(
        "CreateKey",
        admin_pb2.CreateKeyRequest(tenant=tenant, scopes=scope, description=description),
    )
    console.print(
        f"key [bold]{r.key.key_id}[/] for tenant {r.key.tenant} ({', '.join(r.key.scopes)})"
    )
    console.print(f"secret (shown once): [bold yellow]{r.secret}[/]")


@keys_app.command("list")
def keys_list() -> None:
    """List keys (never their secrets)."""
    r = _call("ListKeys", admin_pb2.ListKeysRequest())
    t = Table(title="API keys")
    for col in ("id", "tenant", "scopes", "created", "revoked", "description"):
        t.add_column(col)
    for k in r.keys:
        t.add_row(
            k.key_id,
            k.tenant,
            ",".join(k.scopes),
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(k.created_at)),
            "[red]yes[/]" if k.revoked else "no",
            k.description,
        )
    console.print(t)


@keys_app.command("revoke")
def keys_revoke(key_id: str) -> None:
    """Revoke a key at once."""
    _call("RevokeKey", admin_pb2.RevokeKeyRequest(key_id=key_id))
    console.print(f"revoked {key_id}")


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
def shadow_status(use_case: Annotated[str | None, typer.Argument()] = None) -> None:
    """Agreement, throughput and gate status per case-of-use."""
    r = _call("ShadowStatus", admin_pb2.ShadowStatusRequest(use_case=use_case or ""))
    for c in r.cases:
        _print_case(c)


@shadow_app.command("flip")
def shadow_flip(use_case: str, force: bool = False) -> None:
    """Make the shadow embedder answer USE_CASE (refused unless every gate holds, or --force)."""
    r = _call("Flip", admin_pb2.FlipRequest(use_case=use_case, force=force))
    _print_case(r.case)


@shadow_app.command("unflip")
def shadow_unflip(use_case: str) -> None:
    """Return USE_CASE to the canonical embedder, at once."""
    r = _call("Unflip", admin_pb2.UnflipRequest(use_case=use_case))
    _print_case(r.case)


@self_hosted_app.command("registry")
def registry(
    koder_toml: Annotated[
        str, typer.Option(help="The pairs' declarations; auto = discover as the server does.")
    ] = "auto",
    out: Annotated[Path, typer.Option(help="Where to write the registry.")] = Path(
        "self-hosted-pairs.md"
    ),
) -> None:
    """Write every declared pair, its status, each gate's value and the evidence behind it
    (from the running server when it answers) as markdown."""
    from server.cli_releases import _pairs, registry_lines

    koder_path, pairs = _pairs(koder_toml)
    if not pairs:
        err.print(f"[bold red]error:[/] {koder_path} declares no [self_hosted.<case>] pairs")
        raise typer.Exit(1)
    live: dict[str, admin_pb2.ShadowCase] = {}
    source = f"live evidence from the server at {_conn.addr}"
    try:
        r = _conn.stub().ShadowStatus(
            admin_pb2.ShadowStatusRequest(), timeout=_conn.timeout, metadata=_conn.metadata
        )
        live = {c.use_case: c for c in r.cases}
    except grpc.RpcError as exc:
        source = (
            f"no live evidence: the server at {_conn.addr} did not answer "
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
        if c is None or c.reason:
            lines.append(
                "No evidence: the shadow is not running for this case on that server"
                + (f" ({c.reason})." if c is not None else ".")
            )
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


__all__ = ["admin_app", "keys_app", "self_hosted_app", "shadow_app"]

# `shadow record-release` registers itself on shadow_app; imported last, once it exists.
from server import cli_releases  # noqa: E402, F401
