"""Documents of a folder for `ragplane ingest DIR`: the walk and one reader per kind.

A document is one file (.txt, .md, .html / .htm, .pdf) read into one text, with the
metadata a re-run needs to skip it when unchanged (`sha256` of its bytes). Reading never
raises for a bad file: a file that cannot be read (bad UTF-8, a corrupt PDF, permission
denied, no text in it) comes back as a `Doc` with `error` set, so one bad file never stops
a folder and is always reported by its path.

Text extraction is left to well-kept libraries: pypdf for PDF, BeautifulSoup (the
standard library's `html.parser`, no native parser to install) for HTML. Both are
imported on first use, so listing a folder costs neither.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

KINDS = {".txt": "text", ".md": "markdown", ".html": "html", ".htm": "html", ".pdf": "pdf"}
# The most text one document may have (UTF-8 bytes): the server's limit for a text that it
# chunks. A longer one is reported, not cut.
MAX_TEXT_BYTES = 4 << 20
# Files larger than this are not read at all (a PDF's text is far smaller than its file).
MAX_FILE_BYTES = 256 << 20
_DROPPED_TAGS = ("script", "style", "nav", "noscript", "template")
_BLANK_RUNS = re.compile(r"\n{3,}")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")


@dataclass(frozen=True)
class Doc:
    """One file of the folder, read. `id` is its path relative to the folder with POSIX
    separators (so the same folder gives the same ids on every OS); `mtime` is in unix
    seconds; `size` is the file's bytes. `error` is "" for a document read, else why it
    could not be (and `text` is then "")."""

    id: str
    text: str = ""
    title: str = ""
    mtime: float = 0.0
    sha256: str = ""
    size: int = 0
    error: str = ""

    @property
    def metadata(self) -> dict[str, str | float]:
        return {"path": self.id, "title": self.title, "mtime": self.mtime,
                "sha256": self.sha256}


def walk(root: str) -> tuple[list[str], list[Doc]]:
    """(the documents under `root` as relative POSIX paths, sorted; a failed `Doc` for each
    directory that could not be listed). Hidden files and directories (a name starting
    with '.') are skipped, as are files of other kinds; symlinked directories are not
    followed (a link cycle cannot loop the walk)."""
    found: list[str] = []
    unlisted: list[Doc] = []

    def listing_failed(exc: OSError) -> None:
        rel = _relative(exc.filename or root, root)
        unlisted.append(Doc(id=rel, error=f"cannot list the directory: {exc.strerror or exc}"))

    for here, dirs, names in os.walk(root, onerror=listing_failed):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if not name.startswith(".") and kind_of(name):
                found.append(_relative(os.path.join(here, name), root))
    return sorted(found), unlisted


def kind_of(name: str) -> str:
    """text | markdown | html | pdf, or "" for a file that is not a document."""
    return KINDS.get(os.path.splitext(name)[1].lower(), "")


def _relative(path: str, root: str) -> str:
    return PurePosixPath(*Path(os.path.relpath(path, root)).parts).as_posix()


def read(root: str, rel: str) -> Doc:
    """The document at `rel` under `root`, read and parsed; never raises for a bad file
    (the returned Doc's `error` says what went wrong)."""
    path = os.path.join(root, *rel.split("/"))
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:  # a name of undecodable bytes cannot be an id (or printed)
        shown = rel.encode("utf-8", "backslashreplace").decode("utf-8")
        return Doc(id=shown, error="its name is not valid UTF-8, so it cannot be an id")
    try:
        stat = os.stat(path)
        if stat.st_size > MAX_FILE_BYTES:
            return Doc(id=rel, size=stat.st_size, mtime=stat.st_mtime,
                       error=f"the file is {_mib(stat.st_size)}; files over "
                       f"{_mib(MAX_FILE_BYTES)} are not read")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return Doc(id=rel, error=f"cannot read: {exc.strerror or exc}")
    base = Doc(id=rel, mtime=stat.st_mtime, sha256=hashlib.sha256(data).hexdigest(),
               size=len(data))
    text, title, error = parse(data, kind_of(rel))
    if not error and not text.strip():
        error = "no text in it" + (" (a scanned PDF needs OCR first)" if kind_of(rel) == "pdf"
                                   else "")
    if not error and (n := len(text.encode("utf-8"))) > MAX_TEXT_BYTES:
        error = f"its text is {_mib(n)}; a document may have at most {_mib(MAX_TEXT_BYTES)}"
    if error:
        return replace(base, error=error)
    return replace(base, text=text, title=title or PurePosixPath(rel).stem)


def parse(data: bytes, kind: str) -> tuple[str, str, str]:
    """(text, title, error) of a file's bytes; the title is "" when the file has none."""
    if kind == "pdf":
        return read_pdf(data)
    if kind == "html":
        return (*read_html(data), "")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is not text
    except UnicodeDecodeError as exc:
        return "", "", f"not valid UTF-8 (byte {exc.start}: {exc.reason})"
    text = text.replace("\r\n", "\n")
    return text, (markdown_title(text) if kind == "markdown" else ""), ""


def markdown_title(text: str) -> str:
    """The first level-1 ATX heading (`# Title`) outside code fences, or ""."""
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("# "):
            return line[2:].strip().rstrip("#").strip()
    return ""


def read_html(data: bytes) -> tuple[str, str]:
    """(text, title) of an HTML page: scripts, styles and navigation dropped, one line per
    text node, runs of blank lines collapsed to one. The title is `<title>`, else the
    first `<h1>`. BeautifulSoup finds the encoding (a `<meta charset>`, else a guess)."""
    from bs4 import BeautifulSoup

    with warnings.catch_warnings():
        # e.g. XMLParsedAsHTMLWarning for XHTML: html.parser reads it well enough
        warnings.simplefilter("ignore")
        soup = BeautifulSoup(data, "html.parser")
    title = ""
    if soup.title and soup.title.get_text(strip=True):
        title = soup.title.get_text(" ", strip=True)
    elif (h1 := soup.find("h1")) and h1.get_text(strip=True):
        title = h1.get_text(" ", strip=True)
    for tag in soup.find_all(_DROPPED_TAGS):
        tag.decompose()
    lines = (line.strip() for line in soup.get_text("\n").splitlines())
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip(), title


def read_pdf(data: bytes) -> tuple[str, str, str]:
    """(text, title, error) of a PDF: the pages' text joined with blank lines, the title
    from the document information. A PDF that pypdf cannot open or decrypt is an error."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return "", "", "the PDF is encrypted with a password"
        title = str(reader.metadata.title or "").strip() if reader.metadata else ""
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # pypdf raises many kinds for a damaged file
        return "", "", f"not a readable PDF: {type(exc).__name__}: {exc}"
    return "\n\n".join(p.strip() for p in pages if p.strip()), title, ""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
