"""The long-document set of `bench.documents`: real English documents found on this
machine, and known-item queries taken from past their first 300 words.

Sources, in this order (the first copy of a text wins the deduplication):

1. "python-readmes": the long descriptions (READMEs) of the distributions installed beside
   this interpreter (`importlib.metadata`), the project's own (`ragplane`) left out;
2. "go-doc": the documents in `$(go env GOROOT)/doc` (Go is a build dependency: `make tools`);
3. "npm-doc": the Markdown documentation npm ships in its install (`.../node_modules/npm/docs`);
4. "debian-doc": prose that Debian packages ship in /usr/share/doc (Markdown, reST, plain
   text, HTML; gzipped or not), at most `PER_PACKAGE` documents per package.

None of these is text the tests use (`ragplane.testkit.texts` reads CPython's pydoc topics
and the standard library's docstrings). A document is kept when it has 1,500-12,000
whitespace words, looks like prose (most tokens are words) and yields enough query
sentences; copies (the same text in two packages, or as .md and .html) are dropped.

Queries, for each document, seeded: sentences of 8-40 words that start past the document's
first 300 words, outside code blocks and tables, that occur in no other candidate document.
"verbatim" is the sentence as written (words matter); "pruned" is the same sentence without
its rarest third of words (fewest documents of the set hold them, ties to the later word),
the words a BM25 ranking leans on most, so the query says less in the document's own rare
words and more in common ones.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import importlib.metadata
import math
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

MIN_WORDS, MAX_WORDS = 1_500, 12_000
SKIP_WORDS = 300  # queries start past this many words of their document
SENT_MIN, SENT_MAX = 8, 40
PER_PACKAGE = 8  # debian-doc: documents per package at most, so no package dominates
EXCLUDED_DISTS = frozenset({"ragplane"})  # the project's own README (being edited)
DEBIAN_DOC = Path("/usr/share/doc")
_TEXT_SUFFIXES = (".md", ".markdown", ".rst", ".txt", ".html", ".htm")
# File names of lists, legal text and logs, not prose documents.
_NOT_PROSE = re.compile(
    r"changelog|copyright|news|thanks|authors|acks|license|licence|copying|history|"
    r"test-summary|\.log|credits|contributors|fdl|gpl|refcard|maintainers",
    re.IGNORECASE,
)
_WORD = re.compile(r"^[(\"'`*_\[]*[A-Za-z][a-z'-]*[)\"'`*_\].,;:!?]*$")


@dataclass(frozen=True)
class Document:
    id: str  # source:name, unique
    source: str
    text: str

    @property
    def words(self) -> int:
        return len(self.text.split())


@dataclass(frozen=True)
class Query:
    doc: str  # the relevant document's id
    kind: str  # "verbatim" or "pruned"
    text: str
    at_word: int  # where the sentence starts in its document (whitespace words)
    at_char: int  # and in characters (code points), -1 where not found verbatim


@dataclass(frozen=True)
class DocumentSet:
    docs: list[Document]
    queries: list[Query]
    candidates: dict[str, int]  # documents found per source, before the sample

    def per_source(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.docs:
            out[d.source] = out.get(d.source, 0) + 1
        return out


# --- reading the sources ---------------------------------------------------------------


class _HTMLText(HTMLParser):
    """Visible text of an HTML page, a blank line at each block element, and <pre> blocks
    indented (so the sentence picker treats them as code)."""

    _BLOCK = frozenset("p div h1 h2 h3 h4 h5 h6 li dt dd tr table ul ol blockquote br hr "
                       "section article header footer title pre".split())  # fmt: skip

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in ("script", "style", "head"):
            self._skip += 1
        if tag in self._BLOCK:
            self.parts.append("\n\n")
        if tag == "pre":
            self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head"):
            self._skip = max(0, self._skip - 1)
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._pre:
            data = "\n".join("    " + line for line in data.splitlines())
        self.parts.append(data)


def html_text(raw: str) -> str:
    p = _HTMLText()
    p.feed(raw)
    p.close()
    text = html.unescape("".join(p.parts))
    return re.sub(r"\n[ \t]*\n(\s*\n)+", "\n\n", text)


def _read(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    text = data.decode("utf-8", errors="replace")
    stem = path.name.removesuffix(".gz").lower()
    return html_text(text) if stem.endswith((".html", ".htm")) else text


def python_readmes() -> Iterator[tuple[str, str]]:
    seen: set[str] = set()
    dists = sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"] or "")
    for dist in dists:
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name or name in seen or name in EXCLUDED_DISTS:
            continue
        seen.add(name)
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        yield name, str(text)


def go_docs() -> Iterator[tuple[str, str]]:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)  # fmt: skip
    if go is None:
        return
    try:
        root = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True,
                              timeout=60, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return
    for path in sorted(Path(root, "doc").glob("*")):
        if path.is_file() and path.suffix in _TEXT_SUFFIXES:
            yield path.name, _read(path)


def npm_docs() -> Iterator[tuple[str, str]]:
    npm = shutil.which("npm")
    if npm is None:
        return
    for parent in Path(os.path.realpath(npm)).parents:
        docs = parent / "docs" / "content"
        if parent.name == "npm" and docs.is_dir():
            for path in sorted(docs.rglob("*.md")):
                yield str(path.relative_to(docs)), _read(path)
            return


def _debian_files(package: Path) -> list[Path]:
    """The prose files of one package's doc directory; HTML only where no text or Markdown
    file has the same stem (the same document twice)."""
    files = []
    for path in sorted(package.rglob("*")):
        name = path.name.removesuffix(".gz")
        if not path.is_file() or path.is_symlink() or _NOT_PROSE.search(name):
            continue
        if name.endswith(_TEXT_SUFFIXES) or re.match(r"(README|FAQ)(\.[A-Za-z]+)?$", name):
            files.append(path)
    stems = {p.name.removesuffix(".gz").rsplit(".", 1)[0] for p in files
             if not p.name.removesuffix(".gz").endswith((".html", ".htm"))}  # fmt: skip
    return [
        p
        for p in files
        if not (
            p.name.removesuffix(".gz").endswith((".html", ".htm"))
            and p.name.removesuffix(".gz").rsplit(".", 1)[0] in stems
        )
    ]


def debian_docs() -> Iterator[tuple[str, str]]:
    if not DEBIAN_DOC.is_dir():
        return
    for package in sorted(DEBIAN_DOC.iterdir()):
        if not package.is_dir() or package.is_symlink():
            continue
        for path in _debian_files(package):
            try:
                text = _read(path)
            except (OSError, EOFError, gzip.BadGzipFile):
                continue
            if MIN_WORDS <= len(text.split()) <= MAX_WORDS:
                yield str(path.relative_to(DEBIAN_DOC)), text


SOURCES = {
    "python-readmes": python_readmes,
    "go-doc": go_docs,
    "npm-doc": npm_docs,
    "debian-doc": debian_docs,
}


def _prose(text: str) -> bool:
    tokens = text.split()
    return bool(tokens) and sum(bool(_WORD.match(t)) for t in tokens) / len(tokens) >= 0.6


# --- candidates: filtered, deduplicated, capped per package -----------------------------


def _shingles(text: str) -> set[int]:
    """A sample (1 in 8) of the hashed 8-word shingles of a text, for near-copy checks."""
    words = text.lower().split()
    out = set()
    for i in range(len(words) - 7):
        h = int.from_bytes(hashlib.blake2b(" ".join(words[i : i + 8]).encode(),
                                           digest_size=8).digest(), "little")  # fmt: skip
        if h % 8 == 0:
            out.add(h)
    return out


def _dedup(found: list[Document]) -> list[Document]:
    """`found` without near-copies: a document half of whose shingles an earlier one holds
    (or the reverse) is dropped, the earlier kept."""
    owner: dict[int, int] = {}
    sizes: list[int] = []
    kept: list[Document] = []
    for doc in found:
        sh = _shingles(doc.text)
        shared: dict[int, int] = {}
        for h in sh:
            if h in owner:
                shared[owner[h]] = shared.get(owner[h], 0) + 1
        if any(n > 0.5 * min(len(sh), sizes[k]) for k, n in shared.items()):
            continue
        for h in sh:
            owner.setdefault(h, len(kept))
        sizes.append(len(sh))
        kept.append(doc)
    return kept


def _capped(docs: list[Document], seed: int) -> list[Document]:
    """At most PER_PACKAGE debian-doc documents per package, a seeded sample."""
    by_package: dict[str, list[Document]] = {}
    for d in docs:
        if d.source == "debian-doc":
            by_package.setdefault(d.id.split(":", 1)[1].split("/", 1)[0], []).append(d)
    keep = {d.id for d in docs if d.source != "debian-doc"}
    for package, group in sorted(by_package.items()):
        rng = random.Random(f"{seed}:{package}")
        keep |= {d.id for d in rng.sample(group, min(PER_PACKAGE, len(group)))}
    return [d for d in docs if d.id in keep]


def candidates(seed: int) -> tuple[list[Document], dict[str, int]]:
    """Every usable document of every source, in source order then sorted by name; and how
    many each source offered (within the word range, prose, not a copy)."""
    found: list[Document] = []
    for source, read in SOURCES.items():
        for name, raw in sorted(read()):
            text = raw.replace("\r\n", "\n").replace("\t", "    ")
            if MIN_WORDS <= len(text.split()) <= MAX_WORDS and _prose(text):
                found.append(Document(f"{source}:{name}", source, text))
    docs = _capped(_dedup(found), seed)
    counts = {s: sum(d.source == s for d in docs) for s in SOURCES}
    return docs, counts


# --- sentences and queries -------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_MARKER = re.compile(r"^\s*([-*+]|\d+[.)])\s+")
_NOT_TEXT = re.compile(r"^\s*([|+]|={3,}|-{3,}|#|\.\. |\$ |>>>|<)")


def _base_indent(lines: list[str]) -> int:
    """The indentation of most lines that start with a letter (plain-text documents often
    indent all their paragraphs); code is indented further."""
    counts: dict[int, int] = {}
    for line in lines:
        body = line.lstrip(" ")
        if body[:1].isalpha():
            counts[len(line) - len(body)] = counts.get(len(line) - len(body), 0) + 1
    return max(counts, key=lambda k: (counts[k], -k)) if counts else 0


def _blocks(text: str) -> Iterator[tuple[int, str]]:
    """(word offset, text) of each prose block: paragraphs split at list items, with code
    (fenced or indented), tables, headings and directives left out."""
    at, in_fence, lines = 0, False, text.split("\n")
    code = " " * (_base_indent(lines) + 4)
    block: list[str] = []
    block_at = 0
    for line in [*lines, ""]:
        fence = bool(_FENCE.match(line))
        skip = in_fence or fence or line.startswith(code) or bool(_NOT_TEXT.match(line))
        if fence:
            in_fence = not in_fence
        if skip or not line.strip() or _MARKER.match(line):
            if block:
                yield block_at, " ".join(" ".join(block).split())
                block = []
            if not skip and line.strip():  # a list item starts a block
                block_at = at + len(_MARKER.match(line).group(0).split())
                block = [line[_MARKER.match(line).end() :]]
        else:
            if not block:
                block_at = at
            block.append(line)
        at += len(line.split())


def _is_sentence(s: str) -> bool:
    words = s.split()
    if not (SENT_MIN <= len(words) <= SENT_MAX) or not s[0].isupper():
        return False
    if not s.endswith((".", "!", "?")) or "://" in s or "\ufffd" in s:
        return False
    return sum(bool(_WORD.match(w)) for w in words) >= 0.75 * len(words)


def sentences(text: str) -> list[tuple[int, str]]:
    """(word offset, sentence) of the prose sentences of `text` past SKIP_WORDS words."""
    out = []
    for at, block in _blocks(text):
        for m in re.finditer(r"\S.*?(?:[.!?](?=\s+[A-Z`\"'(*])|$)", block):
            s = m.group(0).strip()
            start = at + len(block[: m.start()].split())
            if start >= SKIP_WORDS and _is_sentence(s):
                out.append((start, s))
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def pruned(sentence: str, df: dict[str, int]) -> str:
    """`sentence` without its rarest quarter of words (by documents holding them)."""
    words = [w for w in sentence.split() if re.search(r"[A-Za-z0-9]", w)]

    def rarity(i: int) -> tuple[int, int]:
        parts = re.findall(r"[a-z0-9]+", words[i].lower())
        return min(df.get(p, 0) for p in parts), -i

    drop = set(sorted(range(len(words)), key=rarity)[: math.ceil(len(words) / 4)])
    return " ".join(w for i, w in enumerate(words) if i not in drop)


def _queries(doc: Document, everything: str, n: int, seed: int) -> list[tuple[int, str]]:
    """n seeded sentences of `doc` that occur once in all the candidates (`everything`)."""
    pool = sentences(doc.text)
    random.Random(f"{seed}:{doc.id}").shuffle(pool)
    chosen: list[tuple[int, str]] = []
    for at, s in pool:
        if everything.count(_norm(s)) == 1:
            chosen.append((at, s))
            if len(chosen) == n:
                break
    return sorted(chosen)


def _char_at(text: str, sentence: str) -> int:
    m = re.search(r"\s+".join(map(re.escape, sentence.split())), text)
    return m.start() if m else -1


def build(n_docs: int, per_doc: int = 2, seed: int = 0,
          max_words: int = MAX_WORDS) -> DocumentSet:  # fmt: skip
    """n_docs documents (a seeded sample of the candidates with per_doc query sentences,
    at most max_words words each) and their queries, verbatim and pruned."""
    docs, counts = candidates(seed)
    everything = "\x00".join(_norm(d.text) for d in docs)
    usable = {}
    for d in docs:
        if d.words <= max_words:
            qs = _queries(d, everything, per_doc, seed)
            if len(qs) == per_doc:
                usable[d.id] = (d, qs)
    ids = sorted(usable)
    picked = sorted(random.Random(seed).sample(ids, min(n_docs, len(ids))))
    chosen = [usable[i][0] for i in picked]
    df: dict[str, int] = {}
    for d in chosen:
        for tok in set(re.findall(r"[a-z0-9]+", d.text.lower())):
            df[tok] = df.get(tok, 0) + 1
    queries = [Query(i, "verbatim", s, at, _char_at(usable[i][0].text, s))
               for i in picked for at, s in usable[i][1]]  # fmt: skip
    queries += [Query(q.doc, "pruned", pruned(q.text, df), q.at_word, q.at_char)
                for q in queries]  # fmt: skip
    return DocumentSet(chosen, queries, counts)
