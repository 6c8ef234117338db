"""Requests built from the client's arguments: one function per RPC, shared by the sync
and the async client. Bad arguments raise ValueError or TypeError here, before any call."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ragplane_client import filters
from ragplane_client.types import Chunking, IndexParams, Item, SearchParams
from ragplane_client.v1 import (
    common_pb2,
    embed_pb2,
    index_pb2,
    memory_pb2,
    search_pb2,
)

MODES = {
    "dense": common_pb2.SEARCH_MODE_DENSE,
    "lexical": common_pb2.SEARCH_MODE_LEXICAL,
    "hybrid": common_pb2.SEARCH_MODE_HYBRID,
}
FUSIONS = {"weighted": common_pb2.FUSION_METHOD_WEIGHTED, "rrf": common_pb2.FUSION_METHOD_RRF}
METRICS = {"cosine": index_pb2.METRIC_COSINE, "ip": index_pb2.METRIC_IP, "l2": index_pb2.METRIC_L2}
INDEX_TYPES = {
    "flat": index_pb2.INDEX_TYPE_FLAT,
    "hnsw": index_pb2.INDEX_TYPE_HNSW,
    "ivf_pq": index_pb2.INDEX_TYPE_IVF_PQ,
}
QUANTIZATIONS = {"none": index_pb2.QUANTIZATION_NONE, "int8": index_pb2.QUANTIZATION_INT8}
SPLITTERS = {"text": index_pb2.CHUNK_SPLITTER_TEXT, "markdown": index_pb2.CHUNK_SPLITTER_MARKDOWN}


def enum(table: Mapping[str, int], value: Any, what: str) -> int:
    """A name of `table` (any case) or one of its protobuf enum numbers."""
    if isinstance(value, int) and value in table.values():
        return value
    code = table.get(str(value).lower())
    if code is None:
        raise ValueError(f"unknown {what} {value!r}; use one of {sorted(table)}")
    return code


def embed(
    texts: Sequence[str], normalize: bool | None, truncate: bool | None, use_case: str
) -> embed_pb2.EmbedRequest:
    if isinstance(texts, str):
        raise TypeError("embed takes a list of texts, not one string")
    req = embed_pb2.EmbedRequest(texts=list(texts), use_case=use_case)
    if normalize is not None:
        req.normalize = normalize
    if truncate is not None:
        req.truncate = truncate
    return req


def create_collection(name: str, **o: Any) -> index_pb2.CreateCollectionRequest:
    req = index_pb2.CreateCollectionRequest(
        name=name,
        metric=enum(METRICS, o.get("metric", "cosine"), "metric"),
        index_type=enum(INDEX_TYPES, o.get("index_type", "flat"), "index type"),
        dim=int(o.get("dim", 0)),
    )
    params = o.get("params")
    if params is not None:
        fields = asdict(params) if isinstance(params, IndexParams) else dict(params)
        if "quantization" in fields:
            fields["quantization"] = enum(QUANTIZATIONS, fields["quantization"], "quantization")
        req.params.CopyFrom(index_pb2.IndexParams(**fields))
    if o.get("lexical_index") is not None:
        req.lexical_index = bool(o["lexical_index"])
    chunking = o.get("chunking")
    if chunking is not None:
        req.chunking.CopyFrom(chunking_pb(chunking))
    return req


def chunking_pb(c: bool | Chunking | Mapping[str, Any]) -> index_pb2.Chunking:
    if isinstance(c, bool):
        c = Chunking(enabled=c)
    elif not isinstance(c, Chunking):
        c = Chunking(**c)
    out = index_pb2.Chunking(
        enabled=c.enabled, max_tokens=c.max_tokens, splitter=enum(SPLITTERS, c.splitter, "splitter")
    )
    if c.overlap_tokens is not None:
        out.overlap_tokens = c.overlap_tokens
    return out


def item_pb(it: Item | Mapping[str, Any] | common_pb2.Item) -> common_pb2.Item:
    """An Item, a dict with the same keys (id, text, vector, metadata), or the message."""
    if isinstance(it, common_pb2.Item):
        return it
    if isinstance(it, Mapping):
        unknown = set(it) - {"id", "text", "vector", "metadata"}
        if unknown:
            raise ValueError(
                f"unknown item key(s) {sorted(unknown)}; use id, text, vector, metadata"
            )
        it = Item(**it)
    out = common_pb2.Item(id=str(it.id), text=it.text or "")
    if it.vector is not None:
        out.vector.extend(float(x) for x in it.vector)
    if it.metadata:
        out.metadata.CopyFrom(filters.to_struct(it.metadata))
    return out


def upsert_batches(
    collection: str, items: Iterable[Any], batch_size: int, batch_bytes: int
) -> Iterator[index_pb2.UpsertRequest]:
    """Upserts of at most `batch_size` items and about `batch_bytes` serialised bytes each
    (an item larger than that alone goes in a batch of its own; the server's message limit
    then decides). Items are converted as they are consumed, so a generator is fine."""
    if batch_size < 1 or batch_bytes < 1:
        raise ValueError("batch_size and batch_bytes must be positive")
    batch: list[common_pb2.Item] = []
    size = 0
    for it in items:
        pb = item_pb(it)
        n = pb.ByteSize() + 8  # the field's tag and length
        if batch and (len(batch) >= batch_size or size + n > batch_bytes):
            yield index_pb2.UpsertRequest(collection=collection, items=batch)
            batch, size = [], 0
        batch.append(pb)
        size += n
    if batch:
        yield index_pb2.UpsertRequest(collection=collection, items=batch)


def get(
    collection: str, ids: Sequence[str], include_vectors: bool, consistency_token: str = ""
) -> index_pb2.GetRequest:
    if isinstance(ids, str):
        ids = [ids]
    return index_pb2.GetRequest(
        collection=collection,
        ids=list(ids),
        include_vectors=include_vectors,
        consistency_token=consistency_token,
    )


def delete(collection: str, ids: Sequence[str] | None, filter: Any) -> index_pb2.DeleteRequest:
    if (ids is None) == (filter is None):
        raise ValueError("delete takes ids or a filter (exactly one)")
    if ids is not None:
        ids = [ids] if isinstance(ids, str) else list(ids)
        return index_pb2.DeleteRequest(collection=collection, ids=common_pb2.IdList(ids=ids))
    return index_pb2.DeleteRequest(collection=collection, filter=filters.to_pb(filter))


def _fusion(o: Mapping[str, Any]) -> common_pb2.Fusion | None:
    if not {"fusion", "rrf_k", "dense_weight"} & set(o):
        return None
    out = common_pb2.Fusion(rrf_k=int(o.get("rrf_k", 0)))
    if o.get("fusion") is not None:
        out.method = enum(FUSIONS, o["fusion"], "fusion")
    if o.get("dense_weight") is not None:
        out.dense_weight = float(o["dense_weight"])
    return out


def search(collection: str, query: str | Sequence[float], **o: Any) -> search_pb2.SearchRequest:
    """`query` is text (embedded by the server; needed by lexical and hybrid modes) or a
    vector."""
    req = search_pb2.SearchRequest(
        collection=collection,
        top_k=int(o.get("top_k", 10)),
        include_text=bool(o.get("include_text", True)),
        include_metadata=bool(o.get("include_metadata", True)),
        mode=enum(MODES, o.get("mode", "dense"), "search mode"),
        chunks_per_hit=int(o.get("chunks_per_hit", 0)),
        group_by=o.get("group_by", ""),
        group_size=int(o.get("group_size", 0)),
        group_limit=int(o.get("group_limit", 0)),
        consistency_token=o.get("consistency_token") or "",
    )
    if isinstance(query, str):
        req.text = query
    else:
        req.vector.values.extend(float(x) for x in query)
    f = filters.to_pb(o.get("filter"))
    if f is not None:
        req.filter.CopyFrom(f)
    fusion = _fusion(o)
    if fusion is not None:
        req.fusion.CopyFrom(fusion)
    if o.get("params") is not None:
        req.params.CopyFrom(search_params(o["params"]))
    return req


def search_params(p: SearchParams | Mapping[str, Any]) -> search_pb2.SearchParams:
    """SearchParams (or a dict of its fields) as the message; None fields stay unset."""
    fields = asdict(p) if isinstance(p, SearchParams) else dict(p)
    unknown = set(fields) - {"ef_search", "nprobe", "exact", "oversampling"}
    if unknown:
        raise ValueError(f"unknown search params {sorted(unknown)}; use ef_search, nprobe, "
                         "exact, oversampling")
    out = search_pb2.SearchParams(exact=bool(fields.get("exact", False)))
    for name in ("ef_search", "nprobe"):
        if fields.get(name) is not None:
            setattr(out, name, int(fields[name]))
    if fields.get("oversampling") is not None:
        out.oversampling = float(fields["oversampling"])
    return out


def remember(
    namespace: str,
    text: str,
    metadata: Mapping[str, Any] | None,
    importance: float | None,
    ttl_seconds: int,
) -> memory_pb2.RememberRequest:
    req = memory_pb2.RememberRequest(namespace=namespace, text=text, ttl_seconds=int(ttl_seconds))
    if metadata:
        req.metadata.CopyFrom(filters.to_struct(metadata))
    if importance is not None:
        req.importance = float(importance)
    return req


def recall(namespace: str, query: str, **o: Any) -> memory_pb2.RecallRequest:
    req = memory_pb2.RecallRequest(
        namespace=namespace,
        query=query,
        top_k=int(o.get("top_k", 5)),
        mode=enum(MODES, o.get("mode", "dense"), "search mode"),
        consistency_token=o.get("consistency_token") or "",
    )
    f = filters.to_pb(o.get("filter"))
    if f is not None:
        req.filter.CopyFrom(f)
    fusion = _fusion(o)
    if fusion is not None:
        req.fusion.CopyFrom(fusion)
    return req


def forget(
    namespace: str, ids: Sequence[str] | None, filter: Any, all: bool
) -> memory_pb2.ForgetRequest:
    if sum((ids is not None, filter is not None, bool(all))) != 1:
        raise ValueError("forget takes ids, a filter or all=True (exactly one)")
    if ids is not None:
        ids = [ids] if isinstance(ids, str) else list(ids)
        return memory_pb2.ForgetRequest(namespace=namespace, ids=common_pb2.IdList(ids=ids))
    if filter is not None:
        return memory_pb2.ForgetRequest(namespace=namespace, filter=filters.to_pb(filter))
    return memory_pb2.ForgetRequest(namespace=namespace, all=True)
