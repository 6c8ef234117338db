"""Every check on what callers hand the engine, written once.

Vectors are validated and prepared (float32, finite, L2-normalised for cosine) here, at the
boundary, so the modules behind it can trust what they receive. `server/` reuses these
checks instead of writing its own copies.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.index import faiss_index as fx
from ragplane.index.repository import Row
from ragplane.index.types import (
    IndexParams,
    IndexType,
    Metric,
    Quantization,
    Record,
    SearchKnobs,
)

MAX_TOP_K = 10_000
MAX_EF_SEARCH = 10_000
MAX_DIM = 65_536
MAX_ID_LEN = 1024
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
NAME_RULE = "use 1-128 characters of letters, digits, '_', '.' or '-'"


def is_name(name: Any) -> bool:
    return isinstance(name, str) and NAME_RE.match(name) is not None


def check_name(name: Any, what: str = "collection name") -> None:
    if not is_name(name):
        raise InvalidArgument(f"{what} {name!r} is invalid: {NAME_RULE}")


def to_enum(cls: Any, value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise InvalidArgument(f"unknown {what} {value!r}; expected one of {allowed}") from None


def check_top_k(top_k: Any, limit: int = MAX_TOP_K) -> int:
    if (
        isinstance(top_k, bool)
        or not isinstance(top_k, (int, np.integer))
        or not 1 <= top_k <= limit
    ):
        raise InvalidArgument(f"top_k must be from 1 to {limit}, got {top_k!r}")
    return int(top_k)


def check_dim(dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise InvalidArgument(f"dim must be an integer from 1 to {MAX_DIM}, got {dim!r}")
    return dim


def check_params(index_type: IndexType, dim: int, params: Any) -> IndexParams:
    if not isinstance(params, IndexParams):
        raise InvalidArgument("params must be IndexParams")
    try:
        fx.validate_params(index_type, dim, params)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    return params


def _positive(value: Any, name: str, most: float) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise InvalidArgument(f"params.{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and 1 <= value <= most):
        raise InvalidArgument(f"params.{name} must be from 1 to {int(most)}, got {value!r}")


def check_knobs(
    knobs: Any, name: str, index_type: IndexType, params: IndexParams, nlist: int | None
) -> SearchKnobs:
    """A request's search parameters checked against its collection: `index_type` and
    `params` as the collection was asked for, `nlist` its IVF index's lists (None while
    it has none). A parameter that does not apply is refused, naming what does."""
    if knobs is None:
        return SearchKnobs()
    if not isinstance(knobs, SearchKnobs):
        raise InvalidArgument("search params must be SearchKnobs")
    _positive(knobs.ef_search, "ef_search", MAX_EF_SEARCH)
    _positive(knobs.nprobe, "nprobe", 1_000_000)
    _positive(knobs.oversampling, "oversampling", fx.MAX_OVERSAMPLING)
    for field, value in (("ef_search", knobs.ef_search), ("nprobe", knobs.nprobe)):
        if value is not None and not float(value).is_integer():
            raise InvalidArgument(f"params.{field} must be a whole number, got {value!r}")
    what = f"collection {name!r} is {index_type.value}"
    if knobs.exact and (knobs.ef_search or knobs.nprobe or knobs.oversampling):
        raise InvalidArgument(
            "params.exact scans every live item without the index: leave ef_search, nprobe "
            "and oversampling unset with it"
        )
    if knobs.ef_search is not None and index_type != IndexType.HNSW:
        raise InvalidArgument(f"params.ef_search applies to hnsw collections; {what}")
    if knobs.nprobe is not None and index_type != IndexType.IVF_PQ:
        raise InvalidArgument(f"params.nprobe applies to ivf_pq collections; {what}")
    if knobs.nprobe is not None and nlist is not None and knobs.nprobe > nlist:
        raise InvalidArgument(
            f"params.nprobe {knobs.nprobe} is more than the {nlist} inverted lists "
            f"(ivf_nlist) of collection {name!r}; use 1 to {nlist}"
        )
    lossy = index_type == IndexType.IVF_PQ or params.quantization != Quantization.NONE
    if knobs.oversampling is not None and not lossy:
        raise InvalidArgument(
            "params.oversampling applies to quantized and ivf_pq collections, whose "
            f"candidates are rescored; {what} with float vectors (its scores are exact)"
        )
    return knobs


def check_ids(ids: Any) -> list[str]:
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument("ids must be a list of strings")
    return list(ids)


def check_min_recall(min_recall: Any) -> float:
    if not isinstance(min_recall, (int, float)) or not 0.0 <= min_recall <= 1.0:
        raise InvalidArgument(f"min_recall must be between 0 and 1, got {min_recall!r}")
    return float(min_recall)


def _first_bad(ok: np.ndarray) -> int | None:
    return None if ok.all() else int(np.flatnonzero(~ok)[0])


def unit_rows(mat: np.ndarray, metric: Metric) -> tuple[np.ndarray, int | None]:
    """`mat` normalised for `metric` (a copy for cosine), and the first row that is not
    finite or (for cosine) cannot be normalised, or None when every row is fine.

    The one place the finite check and the cosine normalisation live: writes, queries and
    re-embedded vectors all go through it.
    """
    if mat.shape[0] == 1:
        # One row (a search's query): its sum of squares is finite exactly when every
        # component is (a NaN or an infinity makes it NaN or inf), so one sum checks it and
        # gives its norm; a sum that overflows takes the full path below. einsum, not dot:
        # BLAS releases the GIL even for 384 floats, and under load every release hands
        # the GIL to another thread and costs this one two context switches to get it back.
        ss = float(np.einsum("i,i->", mat[0], mat[0]))
        if math.isfinite(ss):
            if metric != Metric.COSINE:
                return mat, None
            if ss > 0:
                return mat / np.float32(math.sqrt(ss)), None
    bad = _first_bad(np.isfinite(mat).all(axis=1))
    if bad is not None or metric != Metric.COSINE:
        return mat, bad
    norms = np.linalg.norm(mat, axis=1)
    bad = _first_bad(norms > 0)
    if bad is not None:
        return mat, bad
    return mat / norms[:, None], None


def _finite(mat: np.ndarray, row: int) -> bool:
    return bool(np.isfinite(mat[row]).all())


def record_rows(records: Sequence[Record]) -> list[tuple[str, str, str]]:
    """(id, text, metadata JSON) of each record, after checking ids, text and metadata."""
    if not records:
        raise InvalidArgument("records is empty; send at least one item")
    seen: set[str] = set()
    rows = []
    for i, r in enumerate(records):
        if not isinstance(r, Record):
            raise InvalidArgument(f"item {i} is not a Record")
        if not isinstance(r.id, str) or not r.id:
            raise InvalidArgument(f"item {i} has an empty id; every item needs a unique id")
        if len(r.id) > MAX_ID_LEN:
            raise InvalidArgument(f"item {i}: id is longer than {MAX_ID_LEN} characters")
        if r.id in seen:
            raise InvalidArgument(f"item {i}: id {r.id!r} appears more than once in this request")
        seen.add(r.id)
        if not isinstance(r.text, str):
            raise InvalidArgument(f"item {i} (id {r.id!r}): text must be a string")
        try:
            md = json.dumps(dict(r.metadata or {}), allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise InvalidArgument(
                f"item {i} (id {r.id!r}): metadata is not a JSON object ({e})"
            ) from None
        rows.append((r.id, r.text, md))
    return rows


def record_row_groups(
    records: Sequence[Record], chunked: bool
) -> tuple[list[Row], list[Record]]:
    """The rows (repository.Row) the records are stored as, and one Record per row holding
    its vector: a record with `chunks` is a row per chunk (the item's whole text kept once,
    on chunk 0), any other one row. `chunked`: the collection records chunk offsets (a row
    of an unsplit item then covers its whole text), else offsets are -1."""
    rows: list[Row] = []
    vecs: list[Record] = []
    for i, ((item_id, text, md), r) in enumerate(zip(record_rows(records), records, strict=True)):
        if not r.chunks:
            rows.append((item_id, 0, 0, len(text) if chunked else -1, text, md, None))
            vecs.append(r)
            continue
        if r.vector is not None:
            raise InvalidArgument(f"item {i} (id {item_id!r}): send a vector or chunks, not both")
        for j, sp in enumerate(r.chunks):
            if not 0 <= sp.start < sp.end <= len(text):
                raise InvalidArgument(
                    f"item {i} (id {item_id!r}): chunk {j} spans [{sp.start}, {sp.end}), "
                    f"outside its text of {len(text)} characters"
                )
            piece = text[sp.start:sp.end]
            whole = text if j == 0 and (len(r.chunks) > 1 or piece != text) else None
            rows.append((item_id, j, sp.start, sp.end, piece, md, whole))
            vecs.append(Record(id=f"{item_id} chunk {j}", vector=sp.vector))
    return rows, vecs


def record_vectors(
    records: Sequence[Record], dim: int, metric: Metric, collection: str
) -> np.ndarray:
    """The records' vectors as a float32 [n, dim] matrix, ready to store and index."""
    mat = np.empty((len(records), dim), dtype=np.float32)
    for i, r in enumerate(records):
        v = r.vector
        if v is None:
            raise InvalidArgument(f"item {i} (id {r.id!r}) has no vector; embed its text first")
        try:
            a = np.asarray(v, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidArgument(
                f"item {i} (id {r.id!r}): vector is not a list of numbers"
            ) from None
        if a.shape != (dim,):
            got = a.shape[0] if a.ndim == 1 else "x".join(map(str, a.shape))
            raise InvalidArgument(
                f"item {i} (id {r.id!r}): vector has dimension {got}, collection "
                f"{collection!r} expects {dim}"
            )
        mat[i] = a
    out, bad = unit_rows(mat, metric)
    if bad is not None:
        problem = (
            "vector contains NaN or infinity"
            if not _finite(mat, bad)
            else "zero vector cannot be normalised for cosine"
        )
        raise InvalidArgument(f"item {bad} (id {records[bad].id!r}): {problem}")
    return np.ascontiguousarray(out, dtype=np.float32)


def query_vectors(queries: Any, dim: int, metric: Metric, collection: str) -> np.ndarray:
    """Queries ([dim] or [n, dim]) as a float32 [n, dim] matrix, ready to search."""
    try:
        q = np.asarray(queries, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidArgument("query vectors must be numbers") from None
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[0] == 0:
        raise InvalidArgument("queries must be a non-empty [n, dim] array")
    if q.shape[1] != dim:
        raise InvalidArgument(
            f"query has dimension {q.shape[1]}, collection {collection!r} expects {dim}"
        )
    out, bad = unit_rows(q, metric)
    if bad is not None:
        if not _finite(q, bad):
            raise InvalidArgument("query vector contains NaN or infinity")
        raise InvalidArgument("zero query vector cannot be normalised for cosine")
    return np.ascontiguousarray(out, dtype=np.float32)


def embedded_vectors(out: Any, n: int, metric: Metric) -> np.ndarray:
    """What a re-embedding callback returned for `n` texts, checked and prepared.

    Its failures are the system's, not the caller's request: FailedPrecondition.
    """
    try:
        mat = np.asarray(out, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise FailedPrecondition(
            f"re-embedding returned something that is not a vector array: {e}"
        ) from None
    if mat.ndim != 2 or mat.shape[0] != n:
        raise FailedPrecondition(f"re-embedding {n} texts returned an array of shape {mat.shape}")
    prepared, bad = unit_rows(mat, metric)
    if bad is not None:
        if not _finite(mat, bad):
            raise FailedPrecondition("re-embedding returned NaN or infinity")
        raise FailedPrecondition(
            f"re-embedding returned a zero vector for text {bad}, which cosine cannot normalise"
        )
    return np.ascontiguousarray(prepared, dtype=np.float32)
