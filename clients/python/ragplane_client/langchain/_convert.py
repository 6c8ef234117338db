"""LangChain values to ragplane's and back, shared by the sync and async methods: metadata
that keeps its types, LangChain-style filters, items, documents, and the client-side
fusion of hybrid searches."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.documents import Document

from ragplane_client import filters as f
from ragplane_client.types import Hit, Item
from ragplane_client.v1 import common_pb2

# Metadata is a google.protobuf.Struct on the wire, where every number is a double; the
# client gives whole numbers back as int. A float that is whole (2.0) would so come back
# as 2: its path is kept under this key, and turned back into a float on the way out.
FLOATS_KEY = "_ragplane_floats"

Path = list[str | int]


def encode_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The metadata to store: as given, plus the paths of its whole floats (if any)."""
    if not metadata:
        return {}
    if FLOATS_KEY in metadata:
        raise ValueError(f"metadata key {FLOATS_KEY!r} is reserved by the ragplane store")
    paths: list[Path] = []
    _whole_floats(metadata, [], paths)
    out = dict(metadata)
    if paths:
        out[FLOATS_KEY] = paths
    return out


def _whole_floats(x: Any, path: Path, out: list[Path]) -> None:
    if isinstance(x, float) and x.is_integer():
        out.append(path)
    elif isinstance(x, Mapping):
        for k, v in x.items():
            _whole_floats(v, [*path, str(k)], out)
    elif isinstance(x, list | tuple):
        for i, v in enumerate(x):
            _whole_floats(v, [*path, i], out)


def decode_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Stored metadata as it was given: whole floats float again, the key dropped."""
    out = dict(metadata)
    for path in out.pop(FLOATS_KEY, None) or ():
        parent: Any = out
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = float(parent[path[-1]])
    return out


def to_filter(spec: Any) -> Any:
    """A LangChain-style filter as the client's filter dict.

    Takes the client's own form ({"must": [...], "should": [...], "must_not": [...]}, or a
    common_pb2.Filter) as it is; else a dict of field -> value, every entry a condition
    that must hold: a value is `eq`, a list `in`, and {"$op": value, ...} any of the
    client's operators ($eq, $ne, $in, $nin, $gt, $gte, $lt, $lte, $exists). Nested fields
    are dotted ("author.name")."""
    if spec is None or isinstance(spec, common_pb2.Filter):
        return spec
    if not isinstance(spec, Mapping):
        raise TypeError(f"a filter is a dict; got {type(spec).__name__}")
    if spec and set(spec) <= set(f.CLAUSES):
        return dict(spec)
    conds: list[f.Condition] = []
    for field, value in spec.items():
        if str(field).startswith("$"):
            raise ValueError(
                f"unknown filter key {field!r}: a field -> value dict, or the client's form "
                "with must / should / must_not (its `should` is an or)"
            )
        conds.extend(_conditions(str(field), value))
    return f.where(*conds)


def _conditions(field: str, value: Any) -> list[f.Condition]:
    if isinstance(value, list | tuple):
        return [f.in_(field, value)]
    if not isinstance(value, Mapping):
        return [f.eq(field, value)]
    if not value or not all(str(k).startswith("$") for k in value):
        raise ValueError(
            f"filter on {field!r}: a dict value holds operators ($eq, $gte, ...); name a "
            f"nested field with dots ({field}.inner)"
        )
    out = []
    for op, v in value.items():
        name = str(op)[1:]
        if name not in f.OPS:
            raise ValueError(
                f"unknown filter operator {op!r} on {field!r}; use "
                + ", ".join("$" + o for o in f.OPS)
            )
        out.append({"field": field, "op": name, "value": v})
    return out


def new_ids(ids: Sequence[str | None] | None, n: int) -> list[str]:
    """The ids of n texts: those given (each None replaced by a new UUID), or n new ones."""
    if ids is None:
        return [str(uuid.uuid4()) for _ in range(n)]
    if len(ids) != n:
        raise ValueError(f"got {len(ids)} ids for {n} texts")
    return [str(i) if i is not None else str(uuid.uuid4()) for i in ids]


def items(
    ids: Sequence[str],
    texts: Sequence[str],
    vectors: Sequence[Sequence[float]],
    metadatas: Sequence[Mapping[str, Any] | None] | None,
) -> list[Item]:
    if metadatas is not None and len(metadatas) != len(texts):
        raise ValueError(f"got {len(metadatas)} metadatas for {len(texts)} texts")
    if len(vectors) != len(texts):
        raise ValueError(f"the embedding gave {len(vectors)} vectors for {len(texts)} texts")
    mds: Iterable[Mapping[str, Any] | None] = metadatas or [None] * len(texts)
    return [
        Item(id=i, text=t, vector=list(v), metadata=encode_metadata(m))
        for i, t, v, m in zip(ids, texts, vectors, mds, strict=True)
    ]


def document(id: str, text: str, metadata: Mapping[str, Any] | None) -> Document:
    return Document(id=id, page_content=text, metadata=decode_metadata(metadata or {}))


def scored(hits: Iterable[Hit]) -> list[tuple[Document, float]]:
    return [(document(h.id, h.text, h.metadata), float(h.score)) for h in hits]


def rrf(rankings: Sequence[Sequence[Hit]], k: int, rrf_k: int = 60) -> list[tuple[Hit, float]]:
    """Reciprocal rank fusion: each hit scores the sum of 1 / (rrf_k + rank) over the
    rankings it is in (rank 1 = best); the best k, ties by first appearance."""
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for ranking in rankings:
        for rank, h in enumerate(ranking, start=1):
            scores[h.id] = scores.get(h.id, 0.0) + 1.0 / (rrf_k + rank)
            first.setdefault(h.id, h)
    best = sorted(scores, key=lambda i: -scores[i])[:k]
    return [(first[i], scores[i]) for i in best]
