"""The documents of a folder (`bulk/files.py`): the walk, each reader on a real file
written here, titles and metadata, and bad files that come back with a reason."""

from __future__ import annotations

import hashlib
import os

import pytest
from fpdf import FPDF

from ragplane.server.bulk import files

NOTES = "Grüße aus Köln — naïve café ✓\nsecond line\n"
GUIDE = "Intro line\n\n```\n# not a title: code\n```\n\n# The Guide #\n\nBody ünïcode text.\n"
PAGE = (
    "<html><head><title>Page Title</title><style>p { color: red }</style>"
    "<script>var secret = 1;</script></head><body><nav>Home | About</nav>"
    "<h1>Heading</h1><p>Para one.</p>\n\n\n\n\n<p>Para <b>two</b>, ça va.</p></body></html>"
)


def pdf_bytes(pages: list[str], title: str = "") -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    if title:
        pdf.set_title(title)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    return bytes(pdf.output())


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "docs"
    (d / "sub" / "deeper").mkdir(parents=True)
    (d / ".git").mkdir()
    (d / "notes.txt").write_text(NOTES, encoding="utf-8")
    (d / "guide.md").write_text(GUIDE, encoding="utf-8")
    (d / "page.html").write_text(PAGE, encoding="utf-8")
    (d / "h1only.HTM").write_bytes("<body><h1>Only héading</h1><p>x</p></body>".encode())
    (d / "report.pdf").write_bytes(pdf_bytes(["Page one, café.", "Page two."], "Quarterly"))
    (d / "sub" / "deeper" / "plain.md").write_text("no heading here\n")
    (d / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a PDF body\n")
    (d / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    # not documents, or hidden: never listed
    (d / "data.json").write_text("{}")
    (d / ".draft.md").write_text("# hidden\n")
    (d / ".git" / "notes.txt").write_text("hidden too\n")
    return d


def test_walk_lists_documents_sorted_recursively_with_posix_ids_and_skips_hidden(folder):
    paths, unlisted = files.walk(str(folder))
    assert paths == ["broken.pdf", "guide.md", "h1only.HTM", "latin1.txt", "notes.txt",
                     "page.html", "report.pdf", "sub/deeper/plain.md"]
    assert unlisted == []


def test_text_and_markdown_are_read_as_utf8_with_title_and_metadata(folder):
    doc = files.read(str(folder), "notes.txt")
    raw = (folder / "notes.txt").read_bytes()
    assert doc.error == "" and doc.text == NOTES and doc.title == "notes"
    assert doc.sha256 == hashlib.sha256(raw).hexdigest() and doc.size == len(raw)
    assert doc.mtime == os.stat(folder / "notes.txt").st_mtime
    assert doc.metadata == {"path": "notes.txt", "title": "notes", "mtime": doc.mtime,
                            "sha256": doc.sha256}

    guide = files.read(str(folder), "guide.md")
    assert guide.title == "The Guide" and guide.text == GUIDE
    plain = files.read(str(folder), "sub/deeper/plain.md")
    assert plain.id == "sub/deeper/plain.md" and plain.title == "plain"


def test_html_drops_scripts_styles_and_navigation_and_takes_the_title(folder):
    doc = files.read(str(folder), "page.html")
    assert doc.error == "" and doc.title == "Page Title"
    assert "Heading\nPara one.\n\nPara\ntwo\n, ça va." in doc.text
    assert "secret" not in doc.text and "color" not in doc.text and "Home" not in doc.text
    assert "\n\n\n" not in doc.text
    h1 = files.read(str(folder), "h1only.HTM")
    assert h1.title == "Only héading" and h1.text == "Only héading\nx"


def test_pdf_pages_are_joined_with_a_blank_line_and_the_title_is_the_documents(folder):
    doc = files.read(str(folder), "report.pdf")
    assert doc.error == "" and doc.title == "Quarterly"
    assert doc.text == "Page one, café.\n\nPage two."
    (folder / "untitled.pdf").write_bytes(pdf_bytes(["Just text."]))
    assert files.read(str(folder), "untitled.pdf").title == "untitled"


def test_bad_files_come_back_with_a_reason_instead_of_raising(folder):
    pdf = files.read(str(folder), "broken.pdf")
    assert pdf.text == "" and pdf.error.startswith("not a readable PDF: ")
    assert pdf.sha256 == hashlib.sha256((folder / "broken.pdf").read_bytes()).hexdigest()
    latin = files.read(str(folder), "latin1.txt")
    assert latin.text == "" and latin.error == "not valid UTF-8 (byte 3: invalid continuation byte)"
    gone = files.read(str(folder), "gone.txt")
    assert gone.error == "cannot read: No such file or directory"

    (folder / "blank.md").write_text("  \n\n")
    assert files.read(str(folder), "blank.md").error == "no text in it"
    (folder / "scan.pdf").write_bytes(pdf_bytes([""]))
    assert files.read(str(folder), "scan.pdf").error == (
        "no text in it (a scanned PDF needs OCR first)")


def test_a_text_over_the_limit_is_reported_not_cut(folder, monkeypatch):
    monkeypatch.setattr(files, "MAX_TEXT_BYTES", 16)
    doc = files.read(str(folder), "notes.txt")
    assert doc.text == "" and doc.error.startswith("its text is 0.0 MiB; a document may have")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_permission_denied_is_a_reason(folder):
    (folder / "notes.txt").chmod(0)
    try:
        assert files.read(str(folder), "notes.txt").error == "cannot read: Permission denied"
    finally:
        (folder / "notes.txt").chmod(0o644)
