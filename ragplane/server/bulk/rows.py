"""Rows of an ingest file (JSONL, CSV or Parquet) with the file and line they came from.

Every row comes out: a good one with its id, text and metadata (as canonical JSON), a bad
one with the reason, so that no row is ever dropped without a word. Chunks are columns
(`dict[str, np.ndarray]`), the batch format both the in-process loop and Ray Data use.
A file that cannot be read as its format at all (no `id` column, not Parquet) raises
InvalidArgument naming the file.

Files are opened through pyarrow's filesystems, so a local path and an `s3://` or `gs://`
URI read the same way; `.gz`, `.bz2` and `.zst` files are decompressed on the fly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ragplane.core.errors import InvalidArgument
from ragplane.index.validate import MAX_ID_LEN

ID, TEXT, META, FILE, LINE, ERROR = "id", "text", "metadata", "file", "line", "error"
COLUMNS = (ID, TEXT, META, FILE, LINE, ERROR)
FORMATS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
    ".parquet": "parquet", ".pq": "parquet",
}
COMPRESSIONS = (".gz", ".bz2", ".zst")
_READ = 1 << 20

Row = tuple[int, str, str, str, str]  # line, id, text, metadata JSON, error ("" = good)


def format_of(path: str, forced: str = "") -> str:
    """jsonl | csv | parquet, from `forced` or the file name's extension."""
    if forced:
        if forced not in ("jsonl", "csv", "parquet"):
            raise InvalidArgument(f"format {forced!r} is unknown; use jsonl, csv or parquet")
        return forced
    name = path.lower()
    for suffix in COMPRESSIONS:
        name = name.removesuffix(suffix)
    ext = os.path.splitext(name)[1]
    if ext not in FORMATS:
        raise InvalidArgument(
            f"{path}: cannot tell the format from {ext or 'a name without extension'!r}; "
            "name the file .jsonl, .csv or .parquet, or pass --format"
        )
    return FORMATS[ext]


def _filesystem(path: str) -> tuple[Any, str]:
    from pyarrow import fs

    if "://" in path:
        try:
            return fs.FileSystem.from_uri(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise InvalidArgument(f"cannot open {path}: {exc}") from None
    return fs.LocalFileSystem(), os.path.abspath(path)


def expand(paths: Iterable[str], forced_format: str = "") -> list[str]:
    """The files `paths` name: files as given, directories walked (sorted; names starting
    with '.' or '_' skipped, like Ray's listing), keeping those of a known format."""
    from pyarrow import fs

    out: list[str] = []
    for path in paths:
        filesystem, p = _filesystem(path)
        info = filesystem.get_file_info(p)
        prefix = path[: path.index("://") + 3] if "://" in path else ""
        if info.type == fs.FileType.File:
            format_of(path, forced_format)
            out.append(path if prefix else p)
        elif info.type == fs.FileType.Directory:
            found = sorted(
                i.path for i in filesystem.get_file_info(fs.FileSelector(p, recursive=True))
                if i.type == fs.FileType.File and _listed(i.path, p, forced_format)
            )
            if not found:
                raise InvalidArgument(f"{path} holds no .jsonl, .csv or .parquet files")
            out += [prefix + f if prefix else f for f in found]
        else:
            raise InvalidArgument(f"{path} does not exist")
    return out


def _listed(path: str, root: str, forced_format: str) -> bool:
    if any(part[:1] in "._" for part in os.path.relpath(path, root).split(os.sep)):
        return False
    try:
        format_of(path, forced_format)
    except InvalidArgument:
        return False
    return True


def open_file(path: str, fmt: str) -> Any:
    """A pyarrow file to read `path` from: random access for Parquet, else a stream."""
    filesystem, p = _filesystem(path)
    if fmt == "parquet":
        return filesystem.open_input_file(p)
    return filesystem.open_input_stream(p, compression="detect")


def estimate_rows(files: Iterable[str], forced_format: str = "") -> int:
    """Rows in `files`: exact for Parquet (its footer), lines for JSONL and CSV (a quoted
    newline in a CSV field makes it an overestimate). For the progress bar's ETA."""
    import pyarrow.parquet as pq

    total = 0
    for path in files:
        fmt = format_of(path, forced_format)
        with open_file(path, fmt) as f:
            if fmt == "parquet":
                total += pq.ParquetFile(f).metadata.num_rows
                continue
            lines, last = 0, b"\n"
            while chunk := f.read(_READ):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
            total += lines + (last != b"\n") - (fmt == "csv")
    return total


def chunks(f: Any, path: str, fmt: str, size: int) -> Iterator[dict[str, np.ndarray]]:
    """The rows of one open file as column chunks of at most `size` rows."""
    rows = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet}[fmt](f, path)
    buf: list[Row] = []
    for row in rows:
        buf.append(row)
        if len(buf) >= size:
            yield columns(buf, path)
            buf = []
    if buf:
        yield columns(buf, path)


def columns(rows: list[Row], path: str) -> dict[str, np.ndarray]:
    lines, ids, texts, metas, errors = zip(*rows, strict=True)
    return {
        ID: np.array(ids, dtype=object),
        TEXT: np.array(texts, dtype=object),
        META: np.array(metas, dtype=object),
        FILE: np.array([path] * len(rows), dtype=object),
        LINE: np.array(lines, dtype=np.int64),
        ERROR: np.array(errors, dtype=object),
    }


def read_local(files: Iterable[str], size: int, forced_format: str = "") -> Iterator[dict]:
    """Every row of `files`, in order, as chunks: the in-process reader."""
    for path in files:
        fmt = format_of(path, forced_format)
        with open_file(path, fmt) as f:
            yield from chunks(f, path, fmt, size)


# --- one row -----------------------------------------------------------------------------


def check(rid: Any, text: Any, metadata: Any) -> tuple[str, str, str, str]:
    """(id, text, metadata JSON, error) of one row; error is "" for a good row."""
    problem = _problem(rid, text)
    if problem:
        return "", "", "", problem
    meta, problem = _metadata(metadata)
    return (rid, text, "", problem) if problem else (rid, text, meta, "")


def _problem(rid: Any, text: Any) -> str:
    if rid is None or rid == "":
        return "no id"
    if not isinstance(rid, str):
        return f"id must be a string, got {_kind(rid)} {_clip(rid)}"
    if len(rid) > MAX_ID_LEN:
        return f"id is longer than {MAX_ID_LEN} characters"
    if text is None:
        return f"no text (id {_clip(rid)})"
    if not isinstance(text, str):
        return f"text must be a string, got {_kind(text)} (id {_clip(rid)})"
    if not text.strip():
        return f"text is empty (id {_clip(rid)})"
    if not (_utf8(rid) and _utf8(text)):
        return f"id or text is not valid UTF-8 (id {_clip(rid)})"
    return ""


def _metadata(value: Any) -> tuple[str, str]:
    if value is None or value == "":
        return "{}", ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            return "", f"metadata is not valid JSON ({exc})"
    if not isinstance(value, dict):
        return "", f"metadata must be a JSON object, got {_kind(value)}"
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False,
                          ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return "", f"metadata is not JSON ({exc})"
    return (text, "") if _utf8(text) else ("", "metadata is not valid UTF-8")


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from undecodable bytes
        return False
    return True


def _kind(v: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _clip(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


# --- formats -----------------------------------------------------------------------------


def _lines(f: Any) -> Iterator[bytes]:
    """Lines of a binary stream, each with its b"\\n" (the last one may lack it)."""
    rest = b""
    while chunk := f.read(_READ):
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for p in parts:
            yield p + b"\n"
    if rest:
        yield rest


def _jsonl(f: Any, path: str) -> Iterator[Row]:
    for n, raw in enumerate(_lines(f), 1):
        if not raw.strip():
            continue  # a blank line holds no row
        try:
            obj = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            yield n, "", "", "", f"not valid JSON ({exc})"
            continue
        if not isinstance(obj, dict):
            yield n, "", "", "", f"a line must hold a JSON object, got {_kind(obj)}"
            continue
        yield (n, *check(obj.get(ID), obj.get(TEXT), obj.get(META)))


def _csv(f: Any, path: str) -> Iterator[Row]:
    import csv

    text_lines = (raw.decode("utf-8", "surrogateescape") for raw in _lines(f))
    reader = csv.reader(text_lines)
    header = next(reader, None)
    if header is None:
        return
    header = [h.strip().lstrip("\ufeff") for h in header]
    for need in (ID, TEXT):
        if need not in header:
            raise InvalidArgument(
                f"{path}: the CSV header has no {need!r} column (found: {', '.join(header)}); "
                "the first line must name the columns id, text and optionally metadata"
            )
    at = {name: header.index(name) for name in (ID, TEXT, META) if name in header}
    start = reader.line_num + 1
    for fields in reader:
        line, start = start, reader.line_num + 1
        if not any(fields):
            continue
        if len(fields) != len(header):
            yield line, "", "", "", f"has {len(fields)} fields, the header names {len(header)}"
            continue
        yield (line, *check(fields[at[ID]], fields[at[TEXT]], fields[at[META]] if META in at
                            else None))


def _parquet(f: Any, path: str) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except Exception as exc:  # ArrowInvalid: not Parquet, or damaged
        raise InvalidArgument(f"{path} is not a readable Parquet file: {exc}") from None
    names = pf.schema_arrow.names
    for need in (ID, TEXT):
        if need not in names:
            raise InvalidArgument(
                f"{path}: no {need!r} column (found: {', '.join(names)}); an ingest file needs "
                "the columns id, text and optionally metadata"
            )
    cols = [c for c in (ID, TEXT, META) if c in names]
    n = 0
    for batch in pf.iter_batches(batch_size=4096, columns=cols):
        d = batch.to_pydict()
        meta = d.get(META, [None] * batch.num_rows)
        for rid, text, md in zip(d[ID], d[TEXT], meta, strict=True):
            n += 1
            yield (n, *check(rid, text, md))
