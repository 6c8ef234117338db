"""`ragplane ingest DIR` of a folder of documents against a real server (the fake embedder):
one item per file with its metadata, the unreadable file named with its reason and a
non-zero exit, and a re-run that replaces only the changed file. The same on Ray (marker
`ray`), small."""

from __future__ import annotations

import hashlib
import os
import re
import socket

import grpc
import pytest
from fpdf import FPDF

from ragplane.server.bulk.files import Doc
from ragplane.server.cli.ingest import GrpcDocWriter
from ragplane.v1 import index_pb2, search_pb2

from .test_ingest import flat, invoke

pytestmark = [pytest.mark.e2e]

NOTES = "Grüße aus Köln: notes on the naïve café ✓\nsecond line\n"
GUIDE = "# Setup Guide\n\nInstall the server, then create a collection.\n"
PAGE = ("<html><head><title>Search Page</title><script>var hidden = 1;</script></head>"
        "<body><nav>Home | About</nav><h1>Search</h1><p>Dense and lexical search.</p>"
        "</body></html>")
IDS = ["guide.md", "notes.txt", "page.html", "report.pdf"]


def write_folder(d) -> None:
    """One file of each kind, a corrupt PDF, and a hidden file that is never read."""
    d.mkdir()
    (d / "notes.txt").write_text(NOTES, encoding="utf-8")
    (d / "guide.md").write_text(GUIDE, encoding="utf-8")
    (d / "page.html").write_text(PAGE, encoding="utf-8")
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    pdf.set_title("Quarterly Report")
    for text in ("Revenue grew in the third quarter.", "Costs fell."):
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    (d / "report.pdf").write_bytes(bytes(pdf.output()))
    (d / "broken.pdf").write_bytes(b"%PDF-1.4\nnot a PDF body at all\n")
    (d / ".hidden.md").write_text("# never read\n")


def stored(server, name: str) -> dict[str, tuple[str, dict]]:
    """id -> (text, metadata) of every document id (and the broken one, if it were there)."""
    got = server.stubs.index.Get(index_pb2.GetRequest(
        collection=name, ids=[*IDS, "broken.pdf", ".hidden.md"], include_vectors=False))
    return {it.id: (it.text, dict(it.metadata.items())) for it in got.items}


def expected_metadata(d, rel: str, title: str) -> dict:
    raw = (d / rel).read_bytes()
    return {"path": rel, "title": title, "mtime": os.stat(d / rel).st_mtime,
            "sha256": hashlib.sha256(raw).hexdigest()}


def counts(text: str) -> dict[str, int]:
    names = ["files", "new", "replaced", r"unchanged \(skipped\)", "failed", "chunks", "bytes"]
    found = {n.split(" ")[0]: re.search(rf"{n} ([\d,]+)", text) for n in names}
    assert all(found.values()), text
    return {k: int(m[1].replace(",", "")) for k, m in found.items()}


def check_first_run(server, d, out, name: str) -> None:
    assert out.exit_code == 1, out.output
    text = flat(out.output)
    sizes = sum((d / f).stat().st_size for f in [*IDS, "broken.pdf"])
    got = counts(text)
    assert {k: v for k, v in got.items() if k != "chunks"} == {
        "files": 5, "new": 4, "replaced": 0, "unchanged": 0, "failed": 1, "bytes": sizes}
    assert "failed broken.pdf: not a readable PDF: " in text
    held = stored(server, name)
    assert sorted(held) == IDS
    assert held["notes.txt"] == (NOTES, expected_metadata(d, "notes.txt", "notes"))
    assert held["guide.md"] == (GUIDE, expected_metadata(d, "guide.md", "Setup Guide"))
    page_text, page_meta = held["page.html"]
    assert page_meta == expected_metadata(d, "page.html", "Search Page")
    assert "Dense and lexical search." in page_text
    assert "hidden" not in page_text and "About" not in page_text
    assert held["report.pdf"] == (
        "Revenue grew in the third quarter.\n\nCosts fell.",
        expected_metadata(d, "report.pdf", "Quarterly Report"))


def test_a_folder_is_ingested_one_item_per_file_and_a_rerun_replaces_only_the_changed(
        server, tmp_path):
    d = tmp_path / "docs"
    write_folder(d)
    out = invoke(server.port, str(d), "-c", "kb", "--create")
    check_first_run(server, d, out, "kb")
    assert "in this process" in flat(out.output)

    (d / "guide.md").write_text("# Setup Guide\n\nInstall, create, then ingest a folder.\n")
    again = invoke(server.port, str(d), "-c", "kb")
    assert again.exit_code == 1, again.output
    got = counts(flat(again.output))
    assert {k: v for k, v in got.items() if k not in ("chunks", "bytes")} == {
        "files": 5, "new": 0, "replaced": 1, "unchanged": 3, "failed": 1}
    held = stored(server, "kb")
    assert sorted(held) == IDS
    assert held["guide.md"][0].endswith("then ingest a folder.\n")
    assert held["guide.md"][1]["sha256"] == hashlib.sha256(
        (d / "guide.md").read_bytes()).hexdigest()
    hits = server.stubs.search.Search(search_pb2.SearchRequest(
        collection="kb", text="how to install the server", top_k=10)).hits
    assert sorted(h.id for h in hits) == IDS  # each document once, however chunked

    (d / "broken.pdf").unlink()  # nothing failed, nothing changed: exit 0
    third = invoke(server.port, str(d), "-c", "kb")
    assert third.exit_code == 0, third.output
    assert counts(flat(third.output))["unchanged"] == 4


def test_a_folder_of_row_files_stays_rows_and_docs_needs_one_directory(server, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.jsonl").write_text('{"id": "r1", "text": "a row"}\n')
    (d / "readme.md").write_text("# About these rows\n")
    out = invoke(server.port, str(d), "-c", "rows", "--create")
    assert out.exit_code == 0, out.output
    text = flat(out.output)
    assert "upserted 1" in text and "its 1 documents are left out" in text
    out = invoke(server.port, str(d), str(d), "-c", "rows", "--format", "docs")
    assert out.exit_code == 2 and "--format docs takes one local directory" in out.output
    out = invoke(server.port, str(d), "-c", "docs-of-mixed", "--create", "--format", "docs")
    assert out.exit_code == 0, out.output
    got = server.stubs.index.Get(index_pb2.GetRequest(collection="docs-of-mixed",
                                                      ids=["readme.md", "a.jsonl"]))
    assert [it.id for it in got.items] == ["readme.md"]


class _Late(grpc.RpcError):
    """What a call past its deadline raises."""

    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"

    def trailing_metadata(self):
        return ()


def test_a_batch_past_its_deadline_fails_only_its_files_with_exit_1(
        server, tmp_path, monkeypatch):
    """Every upsert holding slow.md times out: its batch goes again file by file, the other
    files are written, slow.md is named, and the exit code says some files failed."""
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(5):
        (d / f"n{i}.md").write_text(f"# Note {i}\n\nsome words about note {i}\n")
    (d / "slow.md").write_text("# Slow\n\nthis one never gets an answer in time\n")
    real = GrpcDocWriter.__init__
    deadlines: list[float] = []

    def wrapped(self, *a, **kw):
        real(self, *a, **kw)
        upsert = self.index.Upsert

        def late_for_slow(request, timeout, metadata):
            deadlines.append(timeout)
            if any(it.id == "slow.md" for it in request.items):
                raise _Late()
            return upsert(request, timeout=timeout, metadata=metadata)

        self.index.Upsert = late_for_slow

    monkeypatch.setattr(GrpcDocWriter, "__init__", wrapped)
    out = invoke(server.port, str(d), "-c", "kb", "--create", "--timeout", "5")
    assert out.exit_code == 1, out.output
    text = flat(out.output)
    assert "failed slow.md: not written: no answer within 5 s" in text
    assert "1 of 6 files failed" in text
    assert counts(text)["new"] == 5 and counts(text)["failed"] == 1
    got = server.stubs.index.Get(index_pb2.GetRequest(
        collection="kb", ids=[f"n{i}.md" for i in range(5)] + ["slow.md"]))
    assert sorted(it.id for it in got.items) == [f"n{i}.md" for i in range(5)]
    assert len(deadlines) == 1 + 6 and all(t >= 5 for t in deadlines)  # batch, then each


def test_exit_2_when_the_run_itself_fails(server, tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.md").write_text("# A\n\nalpha\n")
    out = invoke(server.port, str(d), "-c", "missing")  # no --create
    assert out.exit_code == 2 and "does not exist" in flat(out.output)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = invoke(port, str(d), "-c", "kb", "--create")
    assert out.exit_code == 2 and "UNAVAILABLE" in flat(out.output)


def test_a_sized_deadline_grows_with_the_text():
    class Conn:
        timeout, metadata = 60.0, []

    writer = GrpcDocWriter.__new__(GrpcDocWriter)
    writer.conn, writer.collection, writer.seconds_per_mib = Conn(), "kb", 600.0
    writer.slowest, seen = 0.0, []
    writer.index = type("S", (), {"Upsert": staticmethod(
        lambda request, timeout, metadata: seen.append(timeout) or index_pb2.UpsertResponse())})
    writer.upsert([Doc(id="big.txt", text="x" * (4 << 20))])
    assert seen == [60.0 + 4 * 600.0]
    writer.slowest = 200.0  # a run whose server took 200 s per MiB so far
    writer.upsert([Doc(id="big.txt", text="x" * (2 << 20))])
    assert seen[-1] == 60.0 + 2 * 4 * 200.0


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_folder_read_by_ray_tasks_gives_the_same_items(server, tmp_path):
    d = tmp_path / "docs"
    write_folder(d)
    out = invoke(server.port, str(d), "-c", "kb", "--create", "--ray", "local")
    check_first_run(server, d, out, "kb")
    assert "a local Ray instance" in flat(out.output)
    assert "one read task per file" in flat(out.output)
