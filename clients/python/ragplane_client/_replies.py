"""Replies turned into the client's dataclasses (ragplane_client.types): one function per
message, shared by the sync and the async client."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2

from ragplane_client.types import (
    Chunk,
    Chunking,
    CollectionInfo,
    EmbedderInfo,
    Embeddings,
    Hit,
    HitGroup,
    IndexParams,
    Item,
    Memory,
    MemoryPage,
    Remembered,
    ScoreParts,
    SearchResult,
)
from ragplane_client.v1 import (
    common_pb2,
    embed_pb2,
    index_pb2,
    memory_pb2,
    search_pb2,
)

_METRIC = {index_pb2.METRIC_IP: "ip", index_pb2.METRIC_L2: "l2"}  # else cosine
_INDEX = {index_pb2.INDEX_TYPE_HNSW: "hnsw", index_pb2.INDEX_TYPE_IVF_PQ: "ivf_pq"}  # else flat
_SPLITTER = {index_pb2.CHUNK_SPLITTER_MARKDOWN: "markdown"}  # else text


def plain(x: Any) -> Any:
    """JSON values as Python's, with whole numbers as int (Struct keeps doubles)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
        return int(x)
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


def struct(s: struct_pb2.Struct) -> dict[str, Any]:
    return plain(json_format.MessageToDict(s)) if s.fields else {}


def value(v: struct_pb2.Value) -> Any:
    return None if v.WhichOneof("kind") is None else plain(json_format.MessageToDict(v))


def _opt(msg: Any, name: str) -> float | None:
    return getattr(msg, name) if msg.HasField(name) else None


def embeddings(r: embed_pb2.EmbedResponse) -> Embeddings:
    return Embeddings(
        vectors=[list(v.values) for v in r.vectors],
        dim=r.dim,
        model=r.model,
        embedder=r.embedder,
        token_counts=list(r.token_counts),
    )


def embedder_info(r: embed_pb2.InfoResponse) -> EmbedderInfo:
    return EmbedderInfo(
        model=r.model,
        dim=r.dim,
        max_seq_length=r.max_seq_length,
        embedder=r.embedder,
        device=r.device,
        max_batch_texts=r.max_batch_texts,
        max_text_bytes=r.max_text_bytes,
    )


def chunking(c: index_pb2.Chunking) -> Chunking:
    return Chunking(
        enabled=c.enabled,
        max_tokens=c.max_tokens,
        overlap_tokens=c.overlap_tokens if c.HasField("overlap_tokens") else None,
        splitter=_SPLITTER.get(c.splitter, "text"),  # type: ignore[arg-type]
    )


def collection(c: index_pb2.CollectionInfo) -> CollectionInfo:
    p = c.params
    return CollectionInfo(
        name=c.name,
        count=c.count,
        chunks=c.chunks,
        dim=c.dim,
        metric=_METRIC.get(c.metric, "cosine"),  # type: ignore[arg-type]
        index_type=_INDEX.get(c.index_type, "flat"),  # type: ignore[arg-type]
        embedder=c.embedder,
        generation=c.generation,
        tombstones=c.tombstones,
        lexical_index=c.lexical_index,
        chunking=chunking(c.chunking),
        params=IndexParams(
            p.hnsw_m, p.hnsw_ef_construction, p.hnsw_ef_search, p.ivf_nlist, p.ivf_nprobe, p.pq_m,
            "int8" if p.quantization == index_pb2.QUANTIZATION_INT8 else "none",
        ),
        created_at=c.created_at,
        consistency_token=c.consistency_token,
    )


def item(it: common_pb2.Item) -> Item:
    return Item(
        id=it.id,
        text=it.text,
        vector=list(it.vector) if it.vector else None,
        metadata=struct(it.metadata),
    )


def hit(h: search_pb2.Hit) -> Hit:
    return Hit(
        id=h.id,
        score=h.score,
        text=h.text,
        metadata=struct(h.metadata),
        dense_score=_opt(h, "dense_score"),
        lexical_score=_opt(h, "lexical_score"),
        fused_score=_opt(h, "fused_score"),
        chunks=tuple(Chunk(c.index, c.start, c.end, c.score, c.text) for c in h.chunks),
    )


def search_result(r: search_pb2.SearchResponse) -> SearchResult:
    return SearchResult(
        hits=tuple(hit(h) for h in r.hits),
        groups=tuple(HitGroup(value(g.key), tuple(hit(h) for h in g.hits)) for g in r.groups),
        returned_k=r.returned_k,
        exhaustive=r.exhaustive,
        embedder=r.embedder,
    )


def memory(m: memory_pb2.Memory) -> Memory:
    parts = None
    if m.HasField("parts"):
        p = m.parts
        parts = ScoreParts(
            relevance=p.relevance,
            recency=p.recency,
            importance=p.importance,
            dense=_opt(p, "dense"),
            lexical=_opt(p, "lexical"),
            fused=_opt(p, "fused"),
        )
    return Memory(
        id=m.id,
        namespace=m.namespace,
        text=m.text,
        metadata=struct(m.metadata),
        importance=m.importance,
        created_at=m.created_at,
        updated_at=m.updated_at,
        expires_at=m.expires_at,
        score=m.score,
        parts=parts,
    )


def remembered(r: memory_pb2.RememberResponse) -> Remembered:
    return Remembered(id=r.id, deduplicated=r.deduplicated, consistency_token=r.consistency_token)


def memories(r: memory_pb2.RecallResponse) -> list[Memory]:
    return [memory(m) for m in r.memories]


def memory_page(r: memory_pb2.ListMemoriesResponse) -> MemoryPage:
    return MemoryPage(tuple(memory(m) for m in r.memories), r.next_page_token)
