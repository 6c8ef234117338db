"""A labelled retrieval set from real text shipped with Python, for dense vs lexical vs
hybrid search (bench section 10).

Documents: the docstrings of the public functions, classes and methods of a fixed list of
standard-library modules (id = the dotted name, text = "name: first paragraphs", as an API
reference page starts), and the pydoc topics of the language reference (id = "topic:KEY").

Queries, each with the one document it should find:

- words matter
  - `identifier`: the bare name of a function or method whose name no other document has
    (`getaddrinfo`, `set_ciphers`), alone or in a short question. Embeddings of rare
    identifiers are weak; BM25 matches them exactly.
  - `rare_term`: a word of 7+ letters that occurs in that document only, twice or more
    (`surrogateescape`-like terms), asked with one common word of the same document.
- meaning matters
  - `paraphrase`: a hand-written request for a function in other words than its docstring
    ("wipe out a folder together with everything inside it" -> shutil.rmtree).
  - `description`: a hand-written description of a language feature -> its pydoc topic.

Deterministic for one Python version (sorted sources, a seeded generator); the docstrings
differ between versions, so the report names the version.
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect
import random
import re
import warnings
from dataclasses import dataclass

MODULES = (
    "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "difflib", "email.utils", "enum", "fnmatch", "functools", "gc",
    "glob", "gzip", "hashlib", "heapq", "html", "http.client", "inspect", "ipaddress",
    "itertools", "json", "locale", "logging", "math", "mimetypes", "operator", "os",
    "os.path", "pathlib", "pickle", "platform", "queue", "random", "re", "secrets", "shlex",
    "shutil", "socket", "sqlite3", "ssl", "statistics", "string", "struct", "subprocess",
    "sys", "tarfile", "tempfile", "textwrap", "threading", "time", "unicodedata",
    "urllib.parse", "uuid", "weakref", "zipfile", "zlib",
)  # fmt: skip
MAX_WORDS = 120
N_IDENTIFIER = 60
N_RARE = 60

# (query, document id): written without the document's own key words where possible.
PARAPHRASES = (
    ("wipe out a folder together with everything inside it", "shutil.rmtree"),
    ("build nested folders in one go, parents included", "os.makedirs"),
    ("turn a python dictionary into text for a web API", "json.dumps"),
    ("read structured text from a web response back into dictionaries and lists", "json.loads"),
    ("duplicate a whole folder hierarchy to a new location", "shutil.copytree"),
    ("how big is this document on disk in bytes", "os.path.getsize"),
    ("which folder is my program running from", "os.getcwd"),
    ("mix up the order of cards in a deck", "random.shuffle"),
    ("select a single winner by lottery from the entries", "random.choice"),
    ("every possible ordering of some items", "itertools.permutations"),
    ("remember results of an expensive function so repeated calls are fast", "functools.lru_cache"),
    ("tally how often each word appears", "collections.Counter"),
    ("fast adding and removing at the front and back of a line of items", "collections.deque"),
    ("the top few biggest values from a big collection", "heapq.nlargest"),
    ("strip the indentation shared by all lines of a multi-line string", "textwrap.dedent"),
    ("pause the program for a little while", "time.sleep"),
    ("high resolution clock to measure how long code takes", "time.perf_counter"),
    ("make binary data smaller to save space", "zlib.compress"),
    ("launch an external program and wait for it to finish", "subprocess.run"),
    ("make a scratch folder that nobody else uses", "tempfile.mkdtemp"),
    ("list every file named like *.txt in a folder", "glob.glob"),
    ("suggest the most similar spelling from a list of words", "difflib.get_close_matches"),
    ("what is this machine's network name", "socket.gethostname"),
    ("create an unguessable password reset code", "secrets.token_hex"),
    ("the value that splits a sorted sample in half", "statistics.median"),
    ("how spread out are these measurements", "statistics.stdev"),
    ("largest number that divides two integers evenly", "math.gcd"),
    ("compare two floats allowing for rounding error", "math.isclose"),
    ("clone an object including everything nested inside it", "copy.deepcopy"),
    ("make a filename safe to paste into a bash command line", "shlex.quote"),
    ("make accented characters compare equal whether composed or not", "unicodedata.normalize"),
    ("visit every subfolder and file below a starting folder", "os.walk"),
    ("does february have 29 days this year", "calendar.isleap"),
    ("which operating system am I on", "platform.system"),
    ("free memory held by unreachable objects right now", "gc.collect"),
    ("how much memory does this object use", "sys.getsizeof"),
    ("convert numbers to raw bytes in a fixed binary layout", "struct.pack"),
    ("make user input safe to show in a web page", "html.escape"),
    ("tell the content type of a file from its extension", "mimetypes.guess_type"),
    ("how much free space is left on the drive", "shutil.disk_usage"),
    ("how many processor cores does the machine have", "os.cpu_count"),
    ("cryptographically strong noise from the kernel", "os.urandom"),
    ("separate the display name from the mailbox in 'Alice <alice@example.com>'",
     "email.utils.parseaddr"),
    ("switch to another folder before opening files", "os.chdir"),
)  # fmt: skip

DESCRIPTIONS = (
    ("check a condition while debugging and stop if it is false", "topic:assert"),
    ("small anonymous one-line functions", "topic:lambda"),
    ("acquire a resource and release it automatically when the block ends", "topic:with"),
    ("a name inside a function that refers to the module level variable", "topic:global"),
    ("produce values lazily one at a time from a function", "topic:yield"),
    ("catch errors and run cleanup code afterwards", "topic:try"),
    ("take a sub-range of a list with start, stop and step", "topic:slicings"),
    ("placeholder syntax with curly braces for building text", "topic:formatstrings"),
    ("which values count as false in a condition", "topic:truth"),
    ("rebind a variable of the enclosing function from an inner function", "topic:nonlocal"),
    ("which operators bind tighter than others", "topic:operator-summary"),
    ("leave a loop early", "topic:break"),
    ("throw an exception yourself", "topic:raise"),
    ("repeat a block as long as a condition holds", "topic:while"),
    ("do nothing, as a placeholder statement", "topic:pass"),
    ("give back a value from a function to its caller", "topic:return"),
)


@dataclass(frozen=True)
class Doc:
    id: str
    text: str


@dataclass(frozen=True)
class Query:
    text: str
    relevant: str  # the id of the one document this query should find
    kind: str  # identifier | rare_term | paraphrase | description
    group: str  # words | meaning


@dataclass(frozen=True)
class QualitySet:
    docs: tuple[Doc, ...]
    queries: tuple[Query, ...]

    def by_group(self, group: str) -> tuple[Query, ...]:
        return tuple(q for q in self.queries if q.group == group)


def _head(text: str) -> str:
    return " ".join(text.split()[:MAX_WORDS])


def _objects(modname: str) -> list[tuple[str, object]]:
    mod = importlib.import_module(modname)
    out: list[tuple[str, object]] = []
    for attr in sorted(dir(mod)):
        if attr.startswith("_"):
            continue
        obj = getattr(mod, attr, None)
        if not (inspect.isroutine(obj) or inspect.isclass(obj)):
            continue
        # A name re-exported from another module of the list is that module's document.
        owner = getattr(obj, "__module__", None) or modname
        if owner != modname and owner in MODULES:
            continue
        out.append((f"{modname}.{attr}", obj))
        if inspect.isclass(obj):
            for m in sorted(vars(obj)):
                if not m.startswith("_") and inspect.isroutine(getattr(obj, m, None)):
                    out.append((f"{modname}.{attr}.{m}", getattr(obj, m)))
    return out


@functools.cache
def documents() -> tuple[Doc, ...]:
    """Docstring documents of MODULES, then pydoc topics; unique ids and texts."""
    from pydoc_data.topics import topics

    docs: dict[str, Doc] = {}
    seen_text: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in MODULES:
            for name, obj in _objects(modname):
                doc = inspect.getdoc(obj) or ""
                if len(doc.split()) < 3 or name in docs:
                    continue
                text = _head(f"{name}: {doc}")
                if text in seen_text:
                    continue
                seen_text.add(text)
                docs[name] = Doc(name, text)
    for key in sorted(topics):
        docs[f"topic:{key}"] = Doc(f"topic:{key}", _head(topics[key]))
    return tuple(docs.values())


_WORD = re.compile(r"[a-z]+")


def _identifier_queries(docs: tuple[Doc, ...], rnd: random.Random) -> list[Query]:
    by_short: dict[str, list[str]] = collections.defaultdict(list)
    for d in docs:
        if not d.id.startswith("topic:"):
            by_short[d.id.rsplit(".", 1)[-1].lower()].append(d.id)
    # Names that read as identifiers, not as English words: an underscore, or long.
    names = sorted(
        ids[0]
        for short, ids in by_short.items()
        if len(ids) == 1 and ("_" in short or len(short) >= 10)
    )
    picked = rnd.sample(names, min(N_IDENTIFIER, len(names)))
    templates = ("{}", "{}", "what does {} do", "how do I use {}")
    return [
        Query(
            templates[i % len(templates)].format(doc_id.rsplit(".", 1)[-1]),
            doc_id,
            "identifier",
            "words",
        )
        for i, doc_id in enumerate(sorted(picked))
    ]


def _rare_term_queries(docs: tuple[Doc, ...], rnd: random.Random) -> list[Query]:
    words = {d.id: _WORD.findall(d.text.lower()) for d in docs}
    df = collections.Counter(w for ws in words.values() for w in set(ws))
    candidates: list[tuple[str, str, str]] = []
    for d in docs:
        counts = collections.Counter(words[d.id])
        name_parts = set(_WORD.findall(d.id.lower()))
        rare = sorted(
            w
            for w, c in counts.items()
            if df[w] == 1 and c >= 2 and len(w) >= 7 and w not in name_parts
        )
        common = sorted(w for w in counts if 1000 > df[w] >= 50 and len(w) >= 4)
        if rare and common:
            candidates.append((d.id, rare[0], common[0]))
    picked = rnd.sample(candidates, min(N_RARE, len(candidates)))
    return [
        Query(f"{common} {rare}", doc_id, "rare_term", "words")
        for doc_id, rare, common in sorted(picked)
    ]


@functools.cache
def build(seed: int = 15) -> QualitySet:
    """The documents and the labelled queries; raises if a hand-written label is missing
    from this Python's documents (a renamed function), so a number never silently drops."""
    docs = documents()
    ids = {d.id for d in docs}
    missing = [doc_id for _, doc_id in (*PARAPHRASES, *DESCRIPTIONS) if doc_id not in ids]
    if missing:
        raise ValueError(f"hand-written queries name documents this Python lacks: {missing}")
    rnd = random.Random(seed)
    queries = [
        *_identifier_queries(docs, rnd),
        *_rare_term_queries(docs, rnd),
        *(Query(q, doc_id, "paraphrase", "meaning") for q, doc_id in PARAPHRASES),
        *(Query(q, doc_id, "description", "meaning") for q, doc_id in DESCRIPTIONS),
    ]
    return QualitySet(docs, tuple(queries))
