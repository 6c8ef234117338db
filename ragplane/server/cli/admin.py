"""`ragplane admin ...`: operate a running server through AdminService (never its data
files behind its back), with readable tables, a progress bar for rebuilds and errors that
say what to do."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from ragplane.server.cli.common import Conn, call, conn_of, connect, console, err, errors
from ragplane.v1 import admin_pb2, index_pb2

admin_app = typer.Typer(
    help="Operate a running server (needs a key with the admin scope).", no_args_is_help=True
)
keys_app = typer.Typer(help="API keys: create, list, revoke.", no_args_is_help=True)
admin_app.add_typer(keys_app, name="keys")
admin_app.callback()(connect)

METRICS = {v: k.removeprefix("METRIC_").lower() for k, v in index_pb2.Metric.items()}
INDEX_TYPES = {v: k.removeprefix("INDEX_TYPE_").lower() for k, v in index_pb2.IndexType.items()}


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
def status(ctx: typer.Context) -> None:
    """Collections, counts, generations, embedder identity and a shadow summary."""
    r = call(ctx, "Status", admin_pb2.StatusRequest())
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
    ctx: typer.Context,
    collection: str,
    index_type: Annotated[str | None, typer.Option(help="flat | hnsw | ivf_pq")] = None,
    hnsw_m: int = 0,
    hnsw_ef_construction: int = 0,
    hnsw_ef_search: int = 0,
    ivf_nlist: int = 0,
    ivf_nprobe: int = 0,
    pq_m: int = 0,
    quantization: Annotated[
        str | None, typer.Option(help="none | int8 (flat, hnsw: 1 byte a dimension, rescored)")
    ] = None,
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
    quantizations = {"none": index_pb2.QUANTIZATION_NONE, "int8": index_pb2.QUANTIZATION_INT8}
    if quantization is not None and quantization not in quantizations:
        raise typer.BadParameter(f"{quantization!r}; use none or int8",
                                 param_hint="--quantization")
    params = index_pb2.IndexParams(
        hnsw_m=hnsw_m,
        hnsw_ef_construction=hnsw_ef_construction,
        hnsw_ef_search=hnsw_ef_search,
        ivf_nlist=ivf_nlist,
        ivf_nprobe=ivf_nprobe,
        pq_m=pq_m,
        quantization=quantizations.get(quantization or "", 0),
    )
    request = admin_pb2.RebuildRequest(
        collection=collection,
        index_type=kinds.get(index_type or "", 0),
        reembed=reembed,
        min_recall=min_recall,
    )
    if any((hnsw_m, hnsw_ef_construction, hnsw_ef_search, ivf_nlist, ivf_nprobe, pq_m,
            quantization)):
        request.params.CopyFrom(params)
    started = time.monotonic()
    last = _follow_rebuild(conn_of(ctx), request)
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


def _follow_rebuild(conn: Conn, request: admin_pb2.RebuildRequest) -> Any:
    """Stream the rebuild's progress into a bar; returns the last report (None if none)."""
    last = None
    with (
        errors(conn),
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
        for p in conn.stub().Rebuild(request, metadata=conn.metadata):
            bar.update(
                task,
                completed=p.done,
                total=p.total or None,
                phase=p.phase,
                rate=p.rate,
                of=p.total,
            )
            last = p
    return last


@admin_app.command()
def rollback(ctx: typer.Context, collection: str) -> None:
    """Serve the previous index generation again."""
    c = call(ctx, "Rollback", admin_pb2.RollbackRequest(collection=collection))
    console.print(f"{c.name} serves generation {c.generation} again")


@admin_app.command()
def compact(ctx: typer.Context, collection: Annotated[str | None, typer.Argument()] = None) -> None:
    """Drop tombstones (deleted and replaced vectors) of one or every collection."""
    r = call(ctx, "Compact", admin_pb2.CompactRequest(collection=collection or ""))
    console.print(f"removed {r.removed:,} tombstones")


@admin_app.command()
def snapshot(ctx: typer.Context, dir: str) -> None:
    """Write a consistent snapshot into DIR on the server's machine."""
    r = call(ctx, "Snapshot", admin_pb2.SnapshotRequest(dir=dir))
    console.print(f"snapshot of {r.bytes / 1e6:,.1f} MB written to {r.dir}")


@admin_app.command()
def restore(
    ctx: typer.Context,
    snapshot_dir: Path,
    data_dir: Annotated[Path, typer.Option(help="The (stopped) server's data directory.")] = Path(
        "./ragplane-data"
    ),
) -> None:
    """Restore a snapshot into a data directory. The server must be stopped."""
    from ragplane.core.errors import RagplaneError
    from ragplane.server.admin import AdminOps

    try:
        AdminOps.restore(snapshot_dir, data_dir)
    except (RagplaneError, OSError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(f"restored {snapshot_dir} into {data_dir}; start the server on it")


@keys_app.command("create")
def keys_create(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Option(help="Tenant the key acts for.")] = "default",
    scope: Annotated[list[str], typer.Option(help="read | write | admin (repeatable).")] = [  # noqa: B006
        "read",
        "write",
    ],
    description: str = "",
) -> None:
    """Create a key; its secret is shown once."""
    r = call(
        ctx,
        "CreateKey",
        admin_pb2.CreateKeyRequest(tenant=tenant, scopes=scope, description=description),
    )
    console.print(
        f"key [bold]{r.key.key_id}[/] for tenant {r.key.tenant} ({', '.join(r.key.scopes)})"
    )
    console.print(f"secret (shown once): [bold yellow]{r.secret}[/]")


@keys_app.command("list")
def keys_list(ctx: typer.Context) -> None:
    """List keys (never their secrets)."""
    r = call(ctx, "ListKeys", admin_pb2.ListKeysRequest())
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
def keys_revoke(ctx: typer.Context, key_id: str) -> None:
    """Revoke a key at once."""
    call(ctx, "RevokeKey", admin_pb2.RevokeKeyRequest(key_id=key_id))
    console.print(f"revoked {key_id}")


__all__ = ["admin_app", "keys_app"]
