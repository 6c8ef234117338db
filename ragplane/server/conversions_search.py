"""Protobuf <-> domain for search options and long documents: hybrid fusion, per-request
search parameters, a collection's quantization, lexical index and chunking, the passages of
a hit, and search groups' keys.
Beside `conversions`, which uses them, so neither outgrows the size limit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format, struct_pb2

from ragplane.core.errors import InvalidArgument
from ragplane.index.types import (
    ChunkHit,
    Chunking,
    Fusion,
    FusionMethod,
    Quantization,
    SearchKnobs,
    Splitter,
)
from ragplane.v1 import common_pb2, index_pb2, search_pb2

FUSION_METHOD_TO_PB = {
    FusionMethod.RRF: common_pb2.FUSION_METHOD_RRF,
    FusionMethod.WEIGHTED: common_pb2.FUSION_METHOD_WEIGHTED,
}
FUSION_METHOD_FROM_PB = {v: k for k, v in FUSION_METHOD_TO_PB.items()} | {
    common_pb2.FUSION_METHOD_UNSPECIFIED: Fusion().method
}

SPLITTER_FROM_PB = {
    index_pb2.CHUNK_SPLITTER_UNSPECIFIED: Splitter.TEXT,
    index_pb2.CHUNK_SPLITTER_TEXT: Splitter.TEXT,
    index_pb2.CHUNK_SPLITTER_MARKDOWN: Splitter.MARKDOWN,
}
SPLITTER_TO_PB = {Splitter.TEXT: index_pb2.CHUNK_SPLITTER_TEXT,
                  Splitter.MARKDOWN: index_pb2.CHUNK_SPLITTER_MARKDOWN}


QUANTIZATION_FROM_PB = {
    index_pb2.QUANTIZATION_UNSPECIFIED: Quantization.NONE,
    index_pb2.QUANTIZATION_NONE: Quantization.NONE,
    index_pb2.QUANTIZATION_INT8: Quantization.INT8,
}
QUANTIZATION_TO_PB = {Quantization.NONE: index_pb2.QUANTIZATION_NONE,
                      Quantization.INT8: index_pb2.QUANTIZATION_INT8}


def quantization_from_pb(v: int) -> Quantization:
    try:
        return QUANTIZATION_FROM_PB[v]
    except KeyError:
        raise InvalidArgument(
            f"params.quantization {v} is unknown; use QUANTIZATION_NONE or QUANTIZATION_INT8"
        ) from None


def knobs_from_pb(req: search_pb2.SearchRequest) -> SearchKnobs | None:
    """SearchRequest.params: None when unset (the collection's defaults). Unset fields stay
    None; the engine checks the values against the collection (`validate.check_knobs`)."""
    if not req.HasField("params"):
        return None
    pb = req.params
    return SearchKnobs(
        ef_search=pb.ef_search if pb.HasField("ef_search") else None,
        nprobe=pb.nprobe if pb.HasField("nprobe") else None,
        exact=pb.exact,
        oversampling=pb.oversampling if pb.HasField("oversampling") else None,
    )


def knobs_to_pb(k: SearchKnobs) -> search_pb2.SearchParams:
    pb = search_pb2.SearchParams(exact=k.exact)
    if k.ef_search is not None:
        pb.ef_search = k.ef_search
    if k.nprobe is not None:
        pb.nprobe = k.nprobe
    if k.oversampling is not None:
        pb.oversampling = k.oversampling
    return pb


def chunking_from_pb(req: index_pb2.CreateCollectionRequest) -> Chunking | None:
    """CreateCollectionRequest.chunking: None when unset (the server's default: on, at the
    embedder's window); overlap_tokens unset is -1 (the default overlap)."""
    if not req.HasField("chunking"):
        return None
    pb = req.chunking
    if pb.splitter not in SPLITTER_FROM_PB:
        raise InvalidArgument(
            f"chunking.splitter {pb.splitter} is unknown; use CHUNK_SPLITTER_TEXT or "
            "CHUNK_SPLITTER_MARKDOWN"
        )
    return Chunking(
        enabled=pb.enabled,
        max_tokens=pb.max_tokens,
        overlap_tokens=pb.overlap_tokens if pb.HasField("overlap_tokens") else -1,
        splitter=SPLITTER_FROM_PB[pb.splitter],
        min_tokens=pb.min_tokens if pb.HasField("min_tokens") else -1,
    )


def chunking_to_pb(c: Chunking) -> index_pb2.Chunking:
    if not c.enabled:
        return index_pb2.Chunking(enabled=False)
    return index_pb2.Chunking(enabled=True, max_tokens=c.max_tokens,
                              overlap_tokens=c.overlap_tokens,
                              splitter=SPLITTER_TO_PB[c.splitter], min_tokens=c.min_tokens)


def chunk_hits_to_pb(chunks: Sequence[ChunkHit]) -> list[search_pb2.ChunkHit]:
    return [search_pb2.ChunkHit(index=c.index, start=c.start, end=c.end, score=c.score,
                                text=c.text) for c in chunks]


def chunk_hits_from_pb(pb: Sequence[search_pb2.ChunkHit]) -> tuple[ChunkHit, ...]:
    return tuple(ChunkHit(c.index, c.start, c.end, c.score, c.text) for c in pb)


def value_to_pb(v: Any) -> struct_pb2.Value:
    return json_format.ParseDict(v, struct_pb2.Value())


def value_from_pb(pb: struct_pb2.Value) -> Any:
    return json_format.MessageToDict(pb)


NO_FUSION = Fusion()  # what an unset Fusion means


def fusion_from_pb(pb: common_pb2.Fusion) -> Fusion:
    """Zero and unset fields take their defaults; index.fusion.check validates the rest."""
    try:
        method = FUSION_METHOD_FROM_PB[pb.method]
    except KeyError:
        raise InvalidArgument(
            f"fusion.method {pb.method} is unknown; use FUSION_METHOD_RRF or FUSION_METHOD_WEIGHTED"
        ) from None
    default = Fusion()
    return Fusion(
        method=method,
        rrf_k=pb.rrf_k or default.rrf_k,
        dense_weight=pb.dense_weight if pb.HasField("dense_weight") else default.dense_weight,
    )


def fusion_to_pb(f: Fusion) -> common_pb2.Fusion:
    return common_pb2.Fusion(
        method=FUSION_METHOD_TO_PB[f.method], rrf_k=f.rrf_k, dense_weight=f.dense_weight
    )


def lexical_index_from_pb(pb: index_pb2.CreateCollectionRequest) -> bool:
    """CreateCollectionRequest.lexical_index: unset means keep one."""
    return pb.lexical_index if pb.HasField("lexical_index") else True
