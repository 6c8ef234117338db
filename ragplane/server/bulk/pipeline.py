"""The ingest pipeline's driver: read -> embed -> upsert, in this process or on Ray.

Both ways run the same stages (`rows.chunks`, `embed.EmbedBatch`) and end in the same
`Sink`, which writes through a `Writer` (the gRPC client) in input order. Writes are
upserts keyed by id, so a re-run, or a run after one killed at any moment, ends with the
collection a clean run gives: the last row of an id wins every time.

Bad rows are never dropped silently: each becomes a `BadRow` (file, line, reason), skipped
and reported, or, with `on_bad_row="fail"`, refused before anything is written (a reading
pass finds them all first). A row the server refuses (INVALID_ARGUMENT) is found by
halving its batch and reported the same way.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from ragplane.core import cpus
from ragplane.core.errors import InvalidArgument
from ragplane.index.types import Record
from ragplane.server.bulk import rows
from ragplane.server.bulk.embed import VECTOR, EmbedBatch, EmbedderSpec

T = TypeVar("T")
BAD_ROW_MODES = ("skip", "fail")


class Writer(Protocol):
    def upsert(self, records: list[Record]) -> None:
        """Write `records` (ids unique); InvalidArgument when the server refuses them."""


@dataclass(frozen=True)
class BadRow:
    file: str
    line: int
    reason: str

    def __str__(self) -> str:  # a Parquet file's "line" is its 1-based row number
        return f"{self.file}:{self.line}: {self.reason}"


class BadRows(InvalidArgument):
    """The input has bad rows and the caller asked to refuse it."""

    def __init__(self, bad: list[BadRow], written: int) -> None:
        self.bad, self.written = bad, written
        head = "; ".join(str(b) for b in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        done = (f"{written} rows were written before it" if written
                else "nothing was written")
        super().__init__(
            f"{len(bad)} bad row{'s' * (len(bad) != 1)}: {head}{more}; {done}. Fix them, or "
            "pass --on-bad-row skip to write the good rows and report the rest"
        )


@dataclass(frozen=True)
class Options:
    batch_rows: int = 256
    on_bad_row: str = "skip"
    forced_format: str = ""
    ray: str = ""  # "" = in this process; local | auto | an address
    actors: int = 0  # Ray actor pool size; 0 = sized to the cluster

    def __post_init__(self) -> None:
        if not 1 <= self.batch_rows <= 2048:
            raise InvalidArgument(f"batch size must be 1..2048, got {self.batch_rows}")
        if self.on_bad_row not in BAD_ROW_MODES:
            raise InvalidArgument(f"on_bad_row {self.on_bad_row!r} is unknown; use skip or fail")
        if self.actors < 0:
            raise InvalidArgument(f"actors must be >= 0, got {self.actors}")


@dataclass
class Summary:
    where: str = ""
    read: int = 0
    upserted: int = 0
    bad: list[BadRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0


Progress = Callable[[Summary], None]


class Sink:
    """Writes embedded column batches in order; counts and reports into `summary`."""

    def __init__(self, writer: Writer, options: Options, summary: Summary,
                 progress: Progress | None = None) -> None:
        self.writer, self.options, self.summary = writer, options, summary
        self.progress = progress or (lambda s: None)

    def write(self, batch: dict[str, np.ndarray]) -> None:
        group: list[Record] = []
        where: list[tuple[str, int]] = []
        ids: set[str] = set()
        for i in range(len(batch[rows.ID])):
            file, line = str(batch[rows.FILE][i]), int(batch[rows.LINE][i])
            if batch[rows.ERROR][i]:
                self._bad(BadRow(file, line, str(batch[rows.ERROR][i])))
                continue
            rid = str(batch[rows.ID][i])
            if rid in ids:  # the later row must land after it
                self._upsert(group, where)
                group, where, ids = [], [], set()
            ids.add(rid)
            group.append(Record(
                id=rid, text=str(batch[rows.TEXT][i]),
                vector=np.asarray(batch[VECTOR][i], dtype=np.float32),
                metadata=json.loads(batch[rows.META][i]),
            ))
            where.append((file, line))
        if group:
            self._upsert(group, where)
        self.summary.read += len(batch[rows.ID])
        self.progress(self.summary)

    def _upsert(self, records: list[Record], where: list[tuple[str, int]]) -> None:
        try:
            self.writer.upsert(records)
        except InvalidArgument as exc:
            if len(records) == 1:
                self._bad(BadRow(*where[0], f"refused by the server: {exc}"))
                return
            mid = len(records) // 2  # find the refused rows; the rest are written
            self._upsert(records[:mid], where[:mid])
            self._upsert(records[mid:], where[mid:])
            return
        self.summary.upserted += len(records)

    def _bad(self, row: BadRow) -> None:
        self.summary.bad.append(row)
        if self.options.on_bad_row == "fail":
            raise BadRows([row], self.summary.upserted)


def find_bad_rows(files: list[str], options: Options) -> list[BadRow]:
    """Every bad row of `files`, by reading them here (no embedding)."""
    bad = []
    for chunk in rows.read_local(files, 4096, options.forced_format):
        for i in np.flatnonzero(chunk[rows.ERROR] != ""):
            bad.append(BadRow(str(chunk[rows.FILE][i]), int(chunk[rows.LINE][i]),
                              str(chunk[rows.ERROR][i])))
    return bad


def ingest(
    files: list[str], spec: EmbedderSpec, writer: Writer, options: Options,
    progress: Progress | None = None, on_start: Callable[[str], None] | None = None,
) -> Summary:
    """Read, embed and write every row of `files`. Raises BadRows (with on_bad_row=fail,
    before writing anything when the files hold bad rows)."""
    if options.on_bad_row == "fail" and (bad := find_bad_rows(files, options)):
        raise BadRows(bad, 0)
    summary = Summary()
    sink = Sink(writer, options, summary, progress)
    t0 = time.monotonic()
    with _batches(files, spec, options) as (where, batches):
        summary.where = where
        if on_start:
            on_start(where)
        for batch in batches:
            sink.write(batch)
    summary.seconds = time.monotonic() - t0
    return summary


@contextlib.contextmanager
def _batches(
    files: list[str], spec: EmbedderSpec, options: Options
) -> Iterator[tuple[str, Iterator[dict[str, np.ndarray]]]]:
    """(where it runs, embedded batches) for the run, in this process or on Ray."""
    o = options
    if not o.ray:
        embed = EmbedBatch(spec)
        chunks = rows.read_local(files, o.batch_rows, o.forced_format)
        batches = prefetch((embed(c) for c in chunks), depth=2)
        try:
            yield "in this process", batches
        finally:
            batches.close()
        return
    from ragplane.server.bulk import raydata

    with raydata.session(o.ray) as cluster:
        n, resources, _ = raydata.pool(cluster, spec, o.actors)
        unit = "GPU" if "num_gpus" in resources else "CPU"
        where = f"{cluster.describe()}, {n} embedding actor{'s' * (n != 1)} of 1 {unit}"
        yield where, raydata.ingest_batches(
            files, spec, cluster, batch_rows=o.batch_rows, forced_format=o.forced_format,
            actors=o.actors,
        )


def prefetch(items: Iterator[T], depth: int) -> Generator[T, None, None]:
    """`items`, produced on a worker thread up to `depth` ahead, so that embedding (which
    releases the GIL) overlaps the caller's writes. Errors are re-raised here."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            try:
                q.put((kind, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put("item", item):
                    return
            put("done", None)
        except BaseException as exc:  # handed to the consumer
            put("error", exc)

    worker = threading.Thread(target=work, name="ingest-embed", daemon=True)
    with cpus.wide():  # on every core, not the request core (ragplane.core.cpus)
        worker.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
