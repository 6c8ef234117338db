"""What the shared store holds, as JSON and float32 blobs: a collection's parameters and
chunking (`rp_collections.config`, `changes.CollectionConfig`), and an item as `rp_items`
keeps it: its text, metadata and chunk offsets as JSON, its vectors in one little-endian
float32 blob (its vector, or one per chunk, in order). No pickle: what a shared database
holds must never run as code."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragplane.index.types import Chunking, IndexParams, Record, Span, Splitter


def chunking_to_json(chunking: Chunking) -> dict[str, Any]:
    return {**dataclasses.asdict(chunking), "splitter": chunking.splitter.value}


def chunking_from_json(d: dict[str, Any]) -> Chunking:
    return Chunking(**{**d, "splitter": Splitter(d.get("splitter", "text"))})


def params_to_json(params: IndexParams) -> dict[str, int]:
    return dataclasses.asdict(params)


def params_from_json(d: dict[str, Any] | None) -> IndexParams | None:
    return None if d is None else IndexParams(**d)


def item_vectors(records: Sequence[Record]) -> list[bytes]:
    """Each record's own blob (its vector, or its chunks' vectors in order)."""
    return [
        b"".join(np.asarray(sp.vector, dtype="<f4").tobytes() for sp in r.chunks)
        if r.chunks else np.asarray(r.vector, dtype="<f4").tobytes()
        for r in records
    ]


def encode_items(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Items as JSON (id, text, metadata, chunk offsets), without their vectors."""
    out = []
    for r in records:
        item: dict[str, Any] = {"id": r.id, "text": r.text, "metadata": dict(r.metadata)}
        if r.chunks:
            item["chunks"] = [[s.start, s.end] for s in r.chunks]
        out.append(item)
    return out


def decode_records(items: list[dict[str, Any]], blob: bytes, dim: int) -> list[Record]:
    """Records from encode_items' JSON and item_vectors' blobs joined, for a collection
    of `dim` dimensions."""
    flat = np.frombuffer(blob, dtype="<f4").astype(np.float32, copy=False)
    mat = flat.reshape(-1, dim) if dim else flat.reshape(0, 0)
    out: list[Record] = []
    row = 0
    for item in items:
        spans = item.get("chunks")
        if spans:
            chunks = [Span(int(s), int(e), mat[row + i]) for i, (s, e) in enumerate(spans)]
            row += len(spans)
            out.append(Record(item["id"], None, item["text"], item["metadata"], chunks))
        else:
            out.append(Record(item["id"], mat[row], item["text"], item["metadata"]))
            row += 1
    return out
