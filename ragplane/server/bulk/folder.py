"""The driver of `ragplane ingest DIR` for a folder of documents: read -> skip the unchanged
-> upsert as text.

The server chunks and embeds documents itself (an item sent with text and no vector), so
nothing is embedded here. The files are read in sorted order (in this process, a thread
ahead of the writes, or as Ray tasks through `raydata`), batched by count and by bytes,
and for each batch the server is asked what it holds: a document stored with the same
`sha256` is skipped, any other is upserted. An upsert replaces the item (and its chunks)
by id, so a re-run, or a run after one killed at any moment, ends with the folder's
current content and never with two copies of a file.

A file that cannot be read, or that the server refuses (INVALID_ARGUMENT, found by halving
its batch), is reported with its path and reason; the rest go on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from ragplane.core.errors import InvalidArgument
from ragplane.server.bulk import files
from ragplane.server.bulk.files import Doc
from ragplane.server.bulk.pipeline import prefetch

BATCH_DOCS = 32
# A request's texts, in UTF-8 bytes: room for two documents of the largest size, and well
# under the server's 64 MiB message limit.
BATCH_BYTES = 8 << 20


class DocWriter(Protocol):
    def stored(self, ids: list[str]) -> dict[str, str]:
        """id -> the `sha256` in the stored metadata ("" if none), for those of `ids` that
        the collection holds."""

    def upsert(self, docs: list[Doc]) -> int:
        """Write `docs` as text items (ids unique); the chunks written. InvalidArgument when
        the server refuses them."""


@dataclass(frozen=True)
class FolderOptions:
    batch_docs: int = BATCH_DOCS
    batch_bytes: int = BATCH_BYTES
    ray: str = ""  # "" = in this process; local | auto | an address

    def __post_init__(self) -> None:
        if not 1 <= self.batch_docs <= BATCH_DOCS:
            raise InvalidArgument(f"documents per upsert must be 1..{BATCH_DOCS}, "
                                  f"got {self.batch_docs}")
        if self.batch_bytes < 1:  # a document larger than this goes alone
            raise InvalidArgument(f"bytes per upsert must be positive, got {self.batch_bytes}")


@dataclass
class FolderSummary:
    where: str = ""
    files: int = 0  # files looked at: the four counts below add up to it
    new: int = 0
    replaced: int = 0
    unchanged: int = 0
    failed: list[Doc] = field(default_factory=list)  # each with its `error`
    chunks: int = 0  # the server's count of chunks written
    bytes: int = 0  # of the files read
    seconds: float = 0.0


Progress = Callable[[FolderSummary], None]


class DocSink:
    """Batches documents by count and bytes; skips, upserts and counts into `summary`."""

    def __init__(self, writer: DocWriter, options: FolderOptions, summary: FolderSummary,
                 progress: Progress | None = None) -> None:
        self.writer, self.options, self.summary = writer, options, summary
        self.progress = progress or (lambda s: None)
        self.batch: list[Doc] = []
        self.held = 0  # UTF-8 bytes of the batch's texts

    def add(self, doc: Doc) -> None:
        self.summary.files += 1
        self.summary.bytes += doc.size
        if doc.error:
            self.summary.failed.append(doc)
        else:
            size = len(doc.text.encode("utf-8"))
            full = len(self.batch) >= self.options.batch_docs
            if self.batch and (full or self.held + size > self.options.batch_bytes):
                self.flush()
            self.batch.append(doc)
            self.held += size
        self.progress(self.summary)

    def flush(self) -> None:
        batch, self.batch, self.held = self.batch, [], 0
        if not batch:
            return
        stored = self.writer.stored([d.id for d in batch])
        todo = [d for d in batch if stored.get(d.id) != d.sha256]
        self.summary.unchanged += len(batch) - len(todo)
        self._upsert(todo, set(stored))
        self.progress(self.summary)

    def _upsert(self, docs: list[Doc], stored: set[str]) -> None:
        if not docs:
            return
        try:
            chunks = self.writer.upsert(docs)
        except InvalidArgument as exc:
            if len(docs) == 1:
                self.summary.failed.append(replace(docs[0], error=f"refused by the server: {exc}"))
                return
            mid = len(docs) // 2  # find the refused documents; the rest are written
            self._upsert(docs[:mid], stored)
            self._upsert(docs[mid:], stored)
            return
        self.summary.chunks += chunks
        replaced = sum(d.id in stored for d in docs)
        self.summary.replaced += replaced
        self.summary.new += len(docs) - replaced


def ingest_folder(
    root: str, listing: tuple[list[str], list[Doc]], writer: DocWriter, options: FolderOptions,
    progress: Progress | None = None, on_start: Callable[[str], None] | None = None,
) -> FolderSummary:
    """Read every document of `listing` (`files.walk(root)`) and write those that changed.
    The failed files are in the summary; nothing here raises for a bad file."""
    paths, unlisted = listing
    summary = FolderSummary()
    sink = DocSink(writer, options, summary, progress)
    t0 = time.monotonic()
    for doc in unlisted:
        sink.add(doc)
    with _documents(root, paths, options) as (where, docs):
        summary.where = where
        if on_start:
            on_start(where)
        for doc in docs:
            sink.add(doc)
    sink.flush()
    summary.seconds = time.monotonic() - t0
    return summary


@contextlib.contextmanager
def _documents(root: str, paths: list[str], options: FolderOptions
               ) -> Iterator[tuple[str, Iterator[Doc]]]:
    """(where it runs, the documents read, in the order of `paths`)."""
    if not options.ray:
        docs = prefetch((files.read(root, p) for p in paths), depth=options.batch_docs)
        try:
            yield "in this process", docs
        finally:
            docs.close()
        return
    from ragplane.server.bulk import raydata

    with raydata.session(options.ray) as cluster:
        docs = raydata.read_documents(root, paths, cluster)
        try:  # its tasks are cancelled before the session ends
            yield f"{cluster.describe()}, one read task per file", docs
        finally:
            docs.close()
