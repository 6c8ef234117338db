"""The folder ingest's driver (`bulk/folder.py`) against a writer in memory: batches by
count and by bytes, unchanged files skipped by sha256, refused documents found and
reported, and a whole folder read in this process."""

from __future__ import annotations

import hashlib

import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.server.bulk import files
from ragplane.server.bulk.files import Doc
from ragplane.server.bulk.folder import (
    BatchFailed,
    DocSink,
    FolderOptions,
    FolderSummary,
    ingest_folder,
)


class MemoryWriter:
    """A collection in a dict; refuses any request holding a text with REFUSE in it."""

    def __init__(self) -> None:
        self.items: dict[str, Doc] = {}
        self.requests: list[list[str]] = []

    def stored(self, ids: list[str]) -> dict[str, str]:
        return {i: self.items[i].sha256 for i in ids if i in self.items}

    def upsert(self, docs: list[Doc]) -> int:
        if any("REFUSE" in d.text for d in docs):
            raise InvalidArgument("text too long")
        if any("SLOW" in d.text for d in docs):  # a batch holding it times out
            raise BatchFailed("no answer within 60 s")
        self.requests.append([d.id for d in docs])
        self.items.update({d.id: d for d in docs})
        return 2 * len(docs)


def doc(i: int, text: str = "") -> Doc:
    text = text or f"document {i}"
    return Doc(id=f"d{i}.txt", text=text, title=f"d{i}", mtime=1.0, size=len(text),
               sha256=hashlib.sha256(text.encode()).hexdigest())


def run(writer: MemoryWriter, docs: list[Doc], **options) -> FolderSummary:
    summary = FolderSummary()
    sink = DocSink(writer, FolderOptions(**options), summary)
    for d in docs:
        sink.add(d)
    sink.flush()
    return summary


def test_batches_by_count_and_by_bytes_in_order():
    writer = MemoryWriter()
    s = run(writer, [doc(i) for i in range(5)], batch_docs=2)
    assert writer.requests == [["d0.txt", "d1.txt"], ["d2.txt", "d3.txt"], ["d4.txt"]]
    assert (s.files, s.new, s.chunks) == (5, 5, 10)

    writer = MemoryWriter()
    big = [doc(0, "x" * 60), doc(1, "y" * 60), doc(2, "z" * 200), doc(3, "w")]
    run(writer, big, batch_bytes=100)  # one over the limit goes alone
    assert writer.requests == [["d0.txt"], ["d1.txt"], ["d2.txt"], ["d3.txt"]]


def test_unchanged_documents_are_skipped_and_changed_ones_replaced():
    writer = MemoryWriter()
    run(writer, [doc(i) for i in range(4)])
    writer.requests.clear()
    s = run(writer, [doc(0), doc(1, "changed"), doc(2), doc(3), doc(4)])
    assert (s.files, s.new, s.replaced, s.unchanged, s.chunks) == (5, 1, 1, 3, 4)
    assert writer.requests == [["d1.txt", "d4.txt"]]
    assert writer.items["d1.txt"].text == "changed"


def test_a_refused_document_is_failed_with_the_reason_and_the_rest_are_written():
    writer = MemoryWriter()
    bad = Doc(id="unread.pdf", size=7, error="not a readable PDF: x")
    s = run(writer, [doc(0), doc(1, "REFUSE me"), bad, doc(2), doc(3)])
    assert sorted(writer.items) == ["d0.txt", "d2.txt", "d3.txt"]
    assert [(d.id, d.error) for d in s.failed] == [
        ("unread.pdf", "not a readable PDF: x"),
        ("d1.txt", "refused by the server: text too long"),
    ]
    assert (s.files, s.new, len(s.failed)) == (5, 3, 2)


class LateWriter(MemoryWriter):
    """Commits a batch, then loses the answer (a deadline passed as the server committed)."""

    def upsert(self, docs: list[Doc]) -> int:
        super().upsert(docs)
        if len(docs) > 1:
            raise BatchFailed("no answer within 60 s")
        return 2


def test_a_failed_batch_is_retried_per_file_and_the_rest_of_the_folder_goes_on():
    writer = MemoryWriter()
    seen: list[tuple[int, int]] = []
    summary = FolderSummary()
    sink = DocSink(writer, FolderOptions(batch_docs=3), summary,
                   lambda s: seen.append((s.settled, s.settled_bytes)))
    docs = [doc(0), doc(1, "SLOW one"), doc(2), doc(3), doc(4), doc(5, "SLOW two"), doc(6)]
    for d in docs:
        sink.add(d)
    sink.flush()
    # the failed batches [0, 1, 2] and [3, 4, 5] went again one document at a time
    assert writer.requests == [["d0.txt"], ["d2.txt"], ["d3.txt"], ["d4.txt"], ["d6.txt"]]
    assert sorted(writer.items) == ["d0.txt", "d2.txt", "d3.txt", "d4.txt", "d6.txt"]
    assert [(d.id, d.error) for d in summary.failed] == [
        ("d1.txt", "not written: no answer within 60 s"),
        ("d5.txt", "not written: no answer within 60 s"),
    ]
    assert (summary.files, summary.new, summary.chunks, summary.settled) == (7, 5, 10, 7)
    assert summary.settled_bytes == sum(d.size for d in docs)
    # progress counts documents settled, never the files only read ahead
    assert seen[-1] == (7, summary.settled_bytes)
    assert all(a <= b for a, b in zip(seen, seen[1:], strict=False))
    assert max(n for n, _ in seen[:3]) == 0  # three files read, none written yet


def test_a_batch_committed_after_its_deadline_is_not_sent_again():
    writer = LateWriter()
    s = run(writer, [doc(i) for i in range(3)])
    assert writer.requests == [["d0.txt", "d1.txt", "d2.txt"]]  # found stored: not resent
    assert (s.new, len(s.failed), s.settled) == (3, 0, 3)


def test_options_are_checked():
    with pytest.raises(InvalidArgument, match="documents per upsert must be 1..32"):
        FolderOptions(batch_docs=33)


def test_a_folder_read_in_this_process(tmp_path):
    (tmp_path / "a.md").write_text("# A\nalpha\n")
    (tmp_path / "b.txt").write_bytes(b"\xff")
    writer = MemoryWriter()
    root = str(tmp_path)
    seen: list[int] = []
    s = ingest_folder(root, files.walk(root), writer, FolderOptions(),
                      progress=lambda s: seen.append(s.files))
    assert s.where == "in this process" and (s.files, s.new) == (2, 1)
    assert writer.items["a.md"].title == "A" and s.failed[0].id == "b.txt"
    assert s.bytes == len("# A\nalpha\n") + 1 and seen[-1] == 2
