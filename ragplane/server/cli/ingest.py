"""`ragplane ingest`: load JSONL, CSV or Parquet files into a collection of a running
server, embedding them here or on a Ray cluster (`ragplane.server.bulk`), with a progress bar and a
summary. The server stores; this command is one of its clients (read and write scopes).

Given one directory of documents (.txt, .md, .html, .pdf) instead, it writes one item per
file as text, which the server chunks and embeds (`bulk.folder`), skipping the files that
the collection already holds unchanged."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Annotated, Any

import grpc
import numpy as np
import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ragplane.core.errors import InvalidArgument, RagplaneError
from ragplane.index.types import Record
from ragplane.server import conversions as conv
from ragplane.server.bulk import rows
from ragplane.server.bulk.embed import EmbedderSpec
from ragplane.server.bulk.files import Doc, walk
from ragplane.server.bulk.folder import (
    BATCH_DOCS,
    BatchFailed,
    FolderOptions,
    FolderSummary,
    ingest_folder,
)
from ragplane.server.bulk.pipeline import BadRows, Options, Summary
from ragplane.server.bulk.pipeline import ingest as run_ingest
from ragplane.server.cli.common import Conn, console, err, errors
from ragplane.v1 import common_pb2, embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc

# The vectors written must be the server's own for the same text, to G1's min cosine.
MIN_PROBE_COSINE = 0.9999
RETRIES = 6
SHOWN_BAD_ROWS = 20
# The server chunks and embeds a document within its Upsert, so that call's deadline grows
# with the text it carries: --timeout, plus this many seconds per MiB, or SLOWER_THAN_SEEN
# times the slowest rate this run has seen, if that is more. A quiet 2-core CPU server
# embeds a MiB of prose in 60-90 s with all-MiniLM-L6-v2 (BENCHMARKS.md section 13); shared
# with other work it took several times that, and a deadline is only there to give up on
# a server that stopped answering (it cancels the embedding).
SECONDS_PER_MIB = 600.0
SLOWER_THAN_SEEN = 4.0
# What `ragplane ingest` exits with: 0 everything written; FAILED_SOME: the run went through
# the whole input but some files (or rows, with --on-bad-row fail) were not written, each
# listed; FAILED_RUN: the run itself failed (the server unreachable or refusing the key, the
# collection missing, a bad option), the summary so far printed; 130 interrupted.
FAILED_SOME, FAILED_RUN = 1, 2
# Codes that concern the whole run, not one batch: retrying other batches cannot help.
_RUN_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
              grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED)


class GrpcWriter:
    """Upserts over gRPC. The first batch's first row is also embedded by the server and
    compared, so vectors of another model never land in the collection; RESOURCE_EXHAUSTED
    and UNAVAILABLE are retried (upserts are idempotent), honouring `retry-after`."""

    def __init__(self, conn: Conn, collection: str, embedder: str) -> None:
        self.conn, self.collection, self.embedder = conn, collection, embedder
        self.index = index_pb2_grpc.IndexServiceStub(conn.channel())
        self.probe: str | None = None  # what the probe found, for the summary

    def upsert(self, records: list[Record]) -> None:
        if self.probe is None:
            self.probe = self._check(records[0])
        request = index_pb2.UpsertRequest(
            collection=self.collection, items=[conv.record_to_item(r) for r in records]
        )
        _retrying(self.index.Upsert, request, self.conn)

    def _check(self, record: Record) -> str:
        stub = embed_pb2_grpc.EmbedServiceStub(self.conn.channel())
        reply = stub.Embed(
            embed_pb2.EmbedRequest(texts=[record.text]),
            timeout=self.conn.timeout, metadata=self.conn.metadata,
        )
        if reply.embedder != self.embedder:
            return f"not compared: the server now embeds with {reply.embedder}"
        theirs = np.asarray(reply.vectors[0].values, dtype=np.float32)
        ours = np.asarray(record.vector, dtype=np.float32)
        cos = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs) or 1.0))
        if cos < MIN_PROBE_COSINE:
            raise InvalidArgument(
                f"the vector embedded here for id {record.id!r} differs from the server's "
                f"(cosine {cos:.6f} < {MIN_PROBE_COSINE}): the model files differ; pass the "
                "server's --model-dir"
            )
        return f"cosine {cos:.6f} to the server's own Embed"


class GrpcDocWriter:
    """`folder.DocWriter` over gRPC: documents go as text items without a vector, which the
    server chunks and embeds (so there is nothing to probe); what is stored is asked with
    Get. Retried as `GrpcWriter` does. An Upsert's deadline is --timeout plus, per MiB of
    its texts, `seconds_per_mib` or SLOWER_THAN_SEEN times the slowest s/MiB of this run's
    upserts so far (a server slowed by load gets room in proportion); a batch that still
    fails (for a reason of its own, not the server's absence) is BatchFailed."""

    def __init__(self, conn: Conn, collection: str,
                 seconds_per_mib: float = SECONDS_PER_MIB) -> None:
        self.conn, self.collection = conn, collection
        self.seconds_per_mib = seconds_per_mib
        self.slowest = 0.0  # s/MiB of this run's upserts of at least 64 KiB
        self.index = index_pb2_grpc.IndexServiceStub(conn.channel())

    def stored(self, ids: list[str]) -> dict[str, str]:
        request = index_pb2.GetRequest(collection=self.collection, ids=ids,
                                       include_vectors=False)
        reply = _retrying(self.index.Get, request, self.conn)
        return {it.id: it.metadata["sha256"] if "sha256" in it.metadata.fields else ""
                for it in reply.items}

    def upsert(self, docs: list[Doc]) -> int:
        request = index_pb2.UpsertRequest(collection=self.collection, items=[
            common_pb2.Item(id=d.id, text=d.text, metadata=conv.dict_to_struct(d.metadata))
            for d in docs
        ])
        mib = sum(len(d.text.encode("utf-8")) for d in docs) / (1 << 20)
        per_mib = max(self.seconds_per_mib, SLOWER_THAN_SEEN * self.slowest)
        deadline = self.conn.timeout + per_mib * mib
        t0 = time.monotonic()
        try:
            chunks = int(_retrying(self.index.Upsert, request, self.conn, deadline).chunks)
            if mib >= 1 / 16:  # small ones are mostly the call's own cost
                self.slowest = max(self.slowest, (time.monotonic() - t0) / mib)
            return chunks
        except grpc.RpcError as exc:
            if exc.code() in _RUN_CODES:
                raise
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise BatchFailed(f"no answer within {deadline:,.0f} s ({mib:.2f} MiB of text;"
                                  " raise --timeout-per-mib for a slower server)") from None
            raise BatchFailed(f"{exc.code().name}: {exc.details()}") from None


def _retrying(call: Any, request: Any, conn: Conn, timeout: float | None = None) -> Any:
    """`call(request)` within `timeout` (default: --timeout), retried on RESOURCE_EXHAUSTED
    and UNAVAILABLE (honouring `retry-after`): only for idempotent calls. INVALID_ARGUMENT
    becomes InvalidArgument."""
    for attempt in range(RETRIES):
        try:
            return call(request, timeout=timeout or conn.timeout, metadata=conn.metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument(exc.details()) from None
            retry = code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
            if not retry or attempt == RETRIES - 1:
                raise
            time.sleep(_retry_after(exc, attempt))
    raise AssertionError("unreachable")


def _retry_after(exc: grpc.RpcError, attempt: int) -> float:
    for key, value in exc.trailing_metadata() or ():
        if key == "retry-after":
            try:
                return min(30.0, float(value))
            except ValueError:
                break
    return min(30.0, 0.5 * 2**attempt)


def _collection(conn: Conn, name: str, create: bool) -> index_pb2.CollectionInfo:
    stub = index_pb2_grpc.IndexServiceStub(conn.channel())
    kw = {"timeout": conn.timeout, "metadata": conn.metadata}
    try:
        info = stub.DescribeCollection(index_pb2.DescribeCollectionRequest(name=name), **kw)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        if not create:
            raise InvalidArgument(
                f"collection {name!r} does not exist on {conn.addr}; pass --create to create it "
                "(cosine, flat, the server's embedder and its dimension)"
            ) from None
        info = stub.CreateCollection(index_pb2.CreateCollectionRequest(name=name), **kw)
        console.print(f"created collection [bold]{name}[/] ({info.dim} dims, {info.embedder})")
    if not info.embedder:
        raise InvalidArgument(
            f"collection {name!r} holds {info.dim}-dim vectors from callers, not from an "
            "embedder, so there is no model to embed the text with; ingest into a collection "
            "created with the server's embedder (dim 0)"
        )
    return info


def ingest(
    paths: Annotated[list[str], typer.Argument(help="Files or directories (.jsonl, .csv, "
                                               ".parquet; .gz ok), local or s3:// / gs://; "
                                               "or one local directory of documents (.txt, "
                                               ".md, .html, .htm, .pdf).")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Target collection.")],
    addr: Annotated[str, typer.Option(envvar="RAGPLANE_ADDR", help="Server address.")] = (
        "127.0.0.1:50051"
    ),
    key: Annotated[str, typer.Option(envvar="RAGPLANE_API_KEY", show_default=False,
                                     help="API key (read and write scopes).")] = "",
    tls_ca: Annotated[str, typer.Option(envvar="RAGPLANE_TLS_CA",
                                        help="CA bundle to verify a TLS server.")] = "",
    ray: Annotated[str, typer.Option(
        envvar="RAGPLANE_RAY_ADDRESS",
        help="off (in this process) | local (a Ray instance on this machine) | auto (the "
        "cluster this machine belongs to) | a cluster address (host:port, ray://host:port).",
    )] = "off",
    batch_size: Annotated[int, typer.Option(help="Rows per embedding batch and per upsert "
                                            f"(documents: at most {BATCH_DOCS}).")] = 256,
    create: Annotated[bool, typer.Option(help="Create the collection if it does not exist.")] = (
        False
    ),
    on_bad_row: Annotated[str, typer.Option(
        help="skip: write the good rows and report the bad ones; fail: write nothing if any "
        "row is bad.")] = "skip",
    fmt: Annotated[str, typer.Option("--format", help="jsonl | csv | parquet (default: from "
                                     "each file's extension) | docs (PATHS is a directory of "
                                     "documents, even one that holds row files).")] = "",
    actors: Annotated[int, typer.Option(help="Ray embedding actors (0: one per GPU, else one "
                                        "per CPU but one per node).")] = 0,
    model_dir: Annotated[str, typer.Option(help="The server's --model-dir, if it has one.")] = "",
    timeout: Annotated[float, typer.Option(help="Seconds per call.")] = 60.0,
    timeout_per_mib: Annotated[float, typer.Option(
        help="Documents: seconds more for an upsert per MiB of text it carries (the server "
        "chunks and embeds it within the call).")] = SECONDS_PER_MIB,
) -> None:
    """Embed and upsert the rows of PATHS (id, text, optional metadata) into a collection;
    or, for one directory of documents, upsert each file as one text item (id: its path in
    the directory) that the server chunks and embeds, skipping files stored unchanged.

    Keyed by id, so running it again (after a failure, or a kill) never duplicates and ends
    with the collection a clean run gives. Exit 0: all written; 1: the run went through but
    some documents failed (each listed; or a row was bad with --on-bad-row fail); 2: the
    run failed (server unreachable, key refused, collection missing, bad option); 130:
    interrupted."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    conn = Conn(addr, key, tls_ca, timeout)
    partial = FolderSummary()  # what a folder's run did before it failed, if it did
    try:
        with errors(conn, scope="read and write", exit_code=FAILED_RUN,
                    before=lambda: _report_partial(partial)):
            options = Options(batch_rows=batch_size, on_bad_row=on_bad_row, forced_format=fmt,
                              ray="" if ray == "off" else ray, actors=actors)
            folder = _folder(paths, fmt)
            try:
                if folder:
                    done: Any = _run_folder(conn, *folder, collection, create, options,
                                            timeout_per_mib, partial)
                else:
                    done = _run(conn, paths, collection, create, model_dir, options)
            except KeyboardInterrupt:
                err.print("interrupted; run the same command again to finish (upserts are "
                          "by id, so nothing is duplicated)")
                raise typer.Exit(130) from None
    except BadRows as exc:
        err.print(f"[bold red]refused:[/] {exc}")
        raise typer.Exit(FAILED_SOME) from None
    except RagplaneError as exc:
        _report_partial(partial)
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(FAILED_RUN) from None
    finally:
        conn.close()
    _finish(done)


def _finish(done: Any) -> None:
    if not isinstance(done, FolderSummary):
        summary, writer = done
        _report(summary, writer.probe)
        return
    _report_folder(done)
    if done.failed:
        err.print(f"[bold red]{len(done.failed)} of {done.files} files failed[/] (listed "
                  "above); the rest are written")
        raise typer.Exit(FAILED_SOME)


def _report_partial(s: FolderSummary) -> None:
    if s.files:
        _report_folder(s)
        err.print(f"the run stopped after {s.settled} of the files; run the same command "
                  "again to finish (unchanged files are skipped)")


def _folder(paths: list[str], fmt: str) -> tuple[str, tuple[list[str], list[Doc]]] | None:
    """(the directory, its listing) when PATHS is one local directory of documents, or
    `--format docs` says so; None for rows. A directory that holds row files is read as
    rows, as before documents could be ingested, with a word about the documents."""
    one_dir = len(paths) == 1 and "://" not in paths[0] and os.path.isdir(paths[0])
    if fmt == "docs":
        if not one_dir:
            raise InvalidArgument("--format docs takes one local directory")
        listing = walk(paths[0])
        if not any(listing):
            raise InvalidArgument(f"{paths[0]} holds no .txt, .md, .html, .htm or .pdf files")
        return paths[0], listing
    if fmt or not one_dir or not (listing := walk(paths[0]))[0]:
        return None
    try:
        rows.expand(paths)
    except InvalidArgument:  # no row files: a folder of documents
        return paths[0], listing
    err.print(f"[yellow]note:[/] {escape(paths[0])} holds row files, so it is read as rows and "
              f"its {len(listing[0])} documents are left out; pass --format docs to ingest "
              "the documents instead")
    return None


def _run(conn: Conn, paths: list[str], collection: str, create: bool, model_dir: str,
         options: Options) -> tuple[Summary, GrpcWriter]:
    files = rows.expand(paths, options.forced_format)
    info = _collection(conn, collection, create)
    spec = EmbedderSpec(info.embedder, model_dir=model_dir)
    writer = GrpcWriter(conn, collection, info.embedder)
    local = all("://" not in f for f in files)
    total = rows.estimate_rows(files, options.forced_format) if local else None
    with Progress(*_columns("rows"), console=err, transient=False) as bar:
        task = bar.add_task("starting", total=total, rate="-")
        t0 = time.monotonic()

        def progress(s: Summary) -> None:
            rate = s.read / max(1e-9, time.monotonic() - t0)
            bar.update(task, completed=s.read, rate=f"{rate:,.0f}")

        def started(where: str) -> None:
            bar.update(task, description=f"ingest -> {collection}")
            err.print(f"embedding with {info.embedder} {where}")

        summary = run_ingest(files, spec, writer, options, progress, on_start=started)
        bar.update(task, completed=summary.read, total=summary.read)
    return summary, writer


def _columns(unit: str) -> list[Any]:
    return [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn(f"{{task.fields[rate]}} {unit}/s"), TimeElapsedColumn(),
            TimeRemainingColumn()]


def _run_folder(conn: Conn, root: str, listing: tuple[list[str], list[Doc]], collection: str,
                create: bool, options: Options, seconds_per_mib: float,
                summary: FolderSummary) -> FolderSummary:
    _collection(conn, collection, create)
    writer = GrpcDocWriter(conn, collection, seconds_per_mib)
    folder_options = FolderOptions(batch_docs=min(options.batch_rows, BATCH_DOCS),
                                   ray=options.ray)
    # pypdf logs what it mends in a damaged file; those it cannot read are reported below
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    total_files = len(listing[0]) + len(listing[1])
    columns = [TextColumn("{task.description}"), BarColumn(),
               TextColumn(f"{{task.fields[files]}}/{total_files} files, "
                          "{task.fields[chunks]} chunks"),
               DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
               TimeRemainingColumn()]
    with Progress(*columns, console=err, transient=False) as bar:
        # by bytes settled (written, skipped, failed): a document's work is its text
        task = bar.add_task("starting", total=_sizes(root, listing[0]) or None, files=0,
                            chunks=0)

        def progress(s: FolderSummary) -> None:
            bar.update(task, completed=s.settled_bytes, files=s.settled, chunks=f"{s.chunks:,}")

        def started(where: str) -> None:
            bar.update(task, description=f"ingest -> {collection}")
            err.print(f"reading documents {where}; the server chunks and embeds them")

        done = ingest_folder(root, listing, writer, folder_options, progress,
                             on_start=started, summary=summary)
        bar.update(task, completed=done.settled_bytes, total=done.settled_bytes or None)
        return done


def _sizes(root: str, paths: list[str]) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):  # reading it will say why
            total += os.stat(os.path.join(root, *p.split("/"))).st_size
    return total


def _report_folder(s: FolderSummary) -> None:
    t = Table(title="ingest summary", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("ran", s.where)
    for name, value in [("files", s.files), ("new", s.new), ("replaced", s.replaced),
                        ("unchanged (skipped)", s.unchanged), ("failed", len(s.failed)),
                        ("chunks", s.chunks), ("bytes", s.bytes)]:
        t.add_row(name, f"{value:,}")
    t.add_row("time", f"{s.seconds:,.1f} s")
    console.print(t)
    for d in s.failed:  # every one: each is a file to mend or to leave out
        console.print(f"[red]failed[/] {escape(d.id)}: {escape(d.error)}")


def _report(s: Summary, probe: str | None) -> None:
    t = Table(title="ingest summary", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("ran", s.where)
    t.add_row("rows read", f"{s.read:,}")
    t.add_row("upserted", f"{s.upserted:,}")
    t.add_row("skipped (bad rows)", f"{len(s.bad):,}")
    t.add_row("time", f"{s.seconds:,.1f} s")
    t.add_row("rate", f"{s.rows_per_second:,.1f} rows/s")
    if probe:
        t.add_row("vectors", probe)
    console.print(t)
    for b in s.bad[:SHOWN_BAD_ROWS]:
        console.print(f"[yellow]skipped[/] {b}")
    if len(s.bad) > SHOWN_BAD_ROWS:
        console.print(f"[yellow]... and {len(s.bad) - SHOWN_BAD_ROWS} more bad rows[/]")
