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
its batch), is reported with its path and reason; the rest go on. So is a file whose batch
could not be written (`BatchFailed`: no answer within the deadline sized to its bytes, a
server error): the batch is retried once document by document (those the server committed
meanwhile are not sent again), and the documents that fail again are reported.

Progress counts documents settled (written, skipped unchanged or failed), the chunks the
server wrote and the bytes of those documents, so a caller can show a rate and an ETA by
the work done rather than by the files read ahead.
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
# A request's texts, in UTF-8 bytes. The server chunks and embeds them within the call, so
# a batch is as much work as its bytes: a small one keeps each call's deadline short and
# the progress fine-grained. A larger document goes alone.
BATCH_BYTES = 1 << 20


class BatchFailed(Exception):
    """A batch could not be written, for a reason that concerns that batch (no answer
    within its deadline, a server error): retried document by document, then reported.
    What ends the whole run (the server unreachable, the key refused) is not this."""


class DocWriter(Protocol):
    def stored(self, ids: list[str]) -> dict[str, str]:
        """id -> the `sha256` in the stored metadata ("" if none), for those of `ids` that
        the collection holds."""

    def upsert(self, docs: list[Doc]) -> int:
        """Write `docs` as text items (ids unique); the chunks written. InvalidArgument when
        the server refuses them, BatchFailed when they could not be written."""


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
    settled_bytes: int = 0  # of the files written, skipped or failed

    @property
    def settled(self) -> int:
        """Documents written, skipped unchanged or failed: the progress made."""
        return self.new + self.replaced + self.unchanged + len(self.failed)


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
            self._failed(doc)
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
        self.summary.settled_bytes += sum(d.size for d in batch if d not in todo)
        self._upsert(todo, set(stored), retry=True)
        self.progress(self.summary)

    def _failed(self, doc: Doc) -> None:
        self.summary.failed.append(doc)
        self.summary.settled_bytes += doc.size

    def _upsert(self, docs: list[Doc], stored: set[str], retry: bool) -> None:
        if not docs:
            return
        try:
            chunks = self.writer.upsert(docs)
        except InvalidArgument as exc:
            if len(docs) == 1:
                self._failed(replace(docs[0], error=f"refused by the server: {exc}"))
                return
            mid = len(docs) // 2  # find the refused documents; the rest are written
            self._upsert(docs[:mid], stored, retry)
            self._upsert(docs[mid:], stored, retry)
            return
        except BatchFailed as exc:
            if not retry:
                for d in docs:
                    self._failed(replace(d, error=f"not written: {exc}"))
                return
            self._retry(docs, stored)
            return
        self._written(docs, stored, chunks)

    def _retry(self, docs: list[Doc], stored: set[str]) -> None:
        """A failed batch, once more one document at a time; those the server committed
        after all (its answer lost) are counted, not sent again."""
        now = self.writer.stored([d.id for d in docs])
        for d in docs:
            if now.get(d.id) == d.sha256:
                self._written([d], stored, 0)  # its chunk count went with the lost answer
            else:
                self._upsert([d], stored, retry=False)
            self.progress(self.summary)

    def _written(self, docs: list[Doc], stored: set[str], chunks: int) -> None:
        self.summary.chunks += chunks
        replaced = sum(d.id in stored for d in docs)
        self.summary.replaced += replaced
        self.summary.new += len(docs) - replaced
        self.summary.settled_bytes += sum(d.size for d in docs)
        self.progress(self.summary)


def ingest_folder(
    root: str, listing: tuple[list[str], list[Doc]], writer: DocWriter, options: FolderOptions,
    progress: Progress | None = None, on_start: Callable[[str], None] | None = None,
    summary: FolderSummary | None = None,
) -> FolderSummary:
    """Read every document of `listing` (`files.walk(root)`) and write those that changed,
    counting into `summary` (which the caller may hold, to report a run that failed part
    way). The failed files are in the summary; nothing here raises for a bad file."""
    paths, unlisted = listing
    summary = summary if summary is not None else FolderSummary()
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
