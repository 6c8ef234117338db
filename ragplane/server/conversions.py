"""All proto <-> domain conversion, in one place.

Servicers call these; domain code (index/, embedding, memory, shadow) never sees a
protobuf message. tests/unit/test_conversions.py round-trips every message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from ragplane.core.errors import InvalidArgument
from ragplane.index.progress import RebuildProgress
from ragplane.index.types import (
    CollectionInfo,
    Condition,
    Filter,
    FilterOp,
    Hit,
    IndexParams,
    IndexType,
    Metric,
    Record,
    SearchMode,
    SearchResult,
)
from ragplane.server.auth import KeyInfo
from ragplane.server.conversions_search import (
    QUANTIZATION_TO_PB,
    chunk_hits_from_pb,
    chunk_hits_to_pb,
    chunking_to_pb,
    quantization_from_pb,
    value_to_pb,
)
from ragplane.server.memory import Memory
from ragplane.server.shadow.releases import ReleaseRecord
from ragplane.server.shadow.types import (
    CaseStatus,
    ClassEvidence,
    FlipEvent,
    GateResult,
    ReleaseEvidence,
)
from ragplane.v1 import admin_pb2, common_pb2, index_pb2, memory_pb2, search_pb2

METRIC_TO_PB = {
    Metric.COSINE: index_pb2.METRIC_COSINE,
    Metric.IP: index_pb2.METRIC_IP,
    Metric.L2: index_pb2.METRIC_L2,
}
METRIC_FROM_PB = {v: k for k, v in METRIC_TO_PB.items()} | {
    index_pb2.METRIC_UNSPECIFIED: Metric.COSINE
}
INDEX_TYPE_TO_PB = {
    IndexType.FLAT: index_pb2.INDEX_TYPE_FLAT,
    IndexType.HNSW: index_pb2.INDEX_TYPE_HNSW,
    IndexType.IVF_PQ: index_pb2.INDEX_TYPE_IVF_PQ,
}
INDEX_TYPE_FROM_PB = {v: k for k, v in INDEX_TYPE_TO_PB.items()} | {
    index_pb2.INDEX_TYPE_UNSPECIFIED: IndexType.FLAT
}
FILTER_OP_TO_PB = {op: getattr(common_pb2, f"FILTER_OP_{op.name}") for op in FilterOp}
FILTER_OP_FROM_PB = {v: k for k, v in FILTER_OP_TO_PB.items()}
SEARCH_MODE_TO_PB = {
    SearchMode.DENSE: common_pb2.SEARCH_MODE_DENSE,
    SearchMode.LEXICAL: common_pb2.SEARCH_MODE_LEXICAL,
    SearchMode.HYBRID: common_pb2.SEARCH_MODE_HYBRID,
}
SEARCH_MODE_FROM_PB = {v: k for k, v in SEARCH_MODE_TO_PB.items()} | {
    common_pb2.SEARCH_MODE_UNSPECIFIED: SearchMode.DENSE
}

# --- enums ---------------------------------------------------------------------------


def metric_from_pb(value: int) -> Metric:
    try:
        return METRIC_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(
            f"metric {value} is unknown; use METRIC_COSINE, METRIC_IP or METRIC_L2"
        ) from None


def index_type_from_pb(value: int) -> IndexType:
    try:
        return INDEX_TYPE_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(
            f"index type {value} is unknown; use INDEX_TYPE_FLAT, INDEX_TYPE_HNSW or "
            "INDEX_TYPE_IVF_PQ"
        ) from None


def search_mode_from_pb(value: int) -> SearchMode:
    try:
        return SEARCH_MODE_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(
            f"mode {value} is unknown; use SEARCH_MODE_DENSE, SEARCH_MODE_LEXICAL or "
            "SEARCH_MODE_HYBRID"
        ) from None


def search_mode_to_pb(mode: SearchMode) -> int:
    return SEARCH_MODE_TO_PB[mode]


# --- metadata --------------------------------------------------------------------------


def struct_to_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    return _to_json(s, "metadata") if s.fields else {}


def _to_json(m: struct_pb2.Struct | struct_pb2.Value, what: str) -> Any:
    # JSON has no NaN or infinity: json_format refuses them with ValueError, which is the
    # caller's bad input, not a bug.
    try:
        return MessageToDict(m)
    except ValueError as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {exc}") from None


def dict_to_struct(d: Mapping[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if d:
        ParseDict(_jsonable(d), s)
    return s


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def value_to_py(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind is None:
        return None
    return _to_json(v, "value")


def py_to_value(x: Any) -> struct_pb2.Value:
    v = struct_pb2.Value()
    if x is not None:
        ParseDict(_jsonable(x), v)
    else:
        v.null_value = struct_pb2.NULL_VALUE
    return v


# --- vectors ---------------------------------------------------------------------------


def vector_from_floats(values: Sequence[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def vectors_to_pb(vectors: np.ndarray) -> list[common_pb2.Vector]:
    return [common_pb2.Vector(values=row) for row in vectors.tolist()]


# --- filters ---------------------------------------------------------------------------


def filter_from_pb(f: common_pb2.Filter) -> Filter | None:
    def conds(items: Sequence[common_pb2.Condition], where: str) -> tuple[Condition, ...]:
        out = []
        for i, c in enumerate(items):
            if c.op not in FILTER_OP_FROM_PB:
                raise InvalidArgument(
                    f"filter.{where}[{i}] on field {c.field!r} has no valid op; use one of "
                    "EQ, NE, IN, NIN, GT, GTE, LT, LTE, EXISTS"
                )
            if not c.field:
                raise InvalidArgument(f"filter.{where}[{i}] has an empty field name")
            value = value_to_py(c.value) if c.HasField("value") else None
            out.append(Condition(field=c.field, op=FILTER_OP_FROM_PB[c.op], value=value))
        return tuple(out)

    result = Filter(
        must=conds(f.must, "must"),
        should=conds(f.should, "should"),
        must_not=conds(f.must_not, "must_not"),
    )
    return None if result.is_empty() else result


def filter_to_pb(f: Filter | None) -> common_pb2.Filter:
    if f is None:
        return common_pb2.Filter()

    def conds(items: Sequence[Condition]) -> list[common_pb2.Condition]:
        out = []
        for c in items:
            pb = common_pb2.Condition(field=c.field, op=FILTER_OP_TO_PB[c.op])
            if c.value is not None:
                pb.value.CopyFrom(py_to_value(c.value))
            out.append(pb)
        return out

    return common_pb2.Filter(must=conds(f.must), should=conds(f.should), must_not=conds(f.must_not))


# --- collections -----------------------------------------------------------------------


_PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(IndexParams) if f.type == "int")


def params_from_pb(p: index_pb2.IndexParams) -> IndexParams:
    values = {name: getattr(p, name) for name in _PARAM_FIELDS}
    for name, v in values.items():
        if v < 0:
            raise InvalidArgument(f"params.{name} must be >= 0 (0 = default), got {v}")
    return IndexParams(**values, quantization=quantization_from_pb(p.quantization))


def params_to_pb(p: IndexParams) -> index_pb2.IndexParams:
    values = {name: getattr(p, name) for name in _PARAM_FIELDS}
    return index_pb2.IndexParams(**values, quantization=QUANTIZATION_TO_PB[p.quantization])


def collection_info_to_pb(c: CollectionInfo) -> index_pb2.CollectionInfo:
    return index_pb2.CollectionInfo(
        name=c.name,
        count=c.count,
        dim=c.dim,
        metric=METRIC_TO_PB[c.metric],
        index_type=INDEX_TYPE_TO_PB[c.index_type],
        embedder=c.embedder,
        generation=c.generation,
        tombstones=c.tombstones,
        params=params_to_pb(c.params),
        created_at=c.created_at,
        lexical_index=c.lexical_index,
        chunking=chunking_to_pb(c.chunking),
        chunks=c.chunks,
    )


def collection_info_from_pb(
    pb: index_pb2.CollectionInfo, tenant: str = "default"
) -> CollectionInfo:
    return CollectionInfo(
        name=pb.name,
        tenant=tenant,
        dim=pb.dim,
        metric=metric_from_pb(pb.metric),
        index_type=index_type_from_pb(pb.index_type),
        embedder=pb.embedder,
        generation=pb.generation,
        count=pb.count,
        tombstones=pb.tombstones,
        params=params_from_pb(pb.params),
        created_at=pb.created_at,
        lexical_index=pb.lexical_index,
    )


# --- items -----------------------------------------------------------------------------


def item_to_record(item: common_pb2.Item, vector: np.ndarray | None = None) -> Record:
    if vector is None and len(item.vector):
        vector = vector_from_floats(item.vector)
    return Record(id=item.id, vector=vector, text=item.text, metadata=struct_to_dict(item.metadata))


def record_to_item(r: Record, include_vector: bool = True) -> common_pb2.Item:
    item = common_pb2.Item(id=r.id, text=r.text, metadata=dict_to_struct(r.metadata))
    if include_vector and r.vector is not None:
        item.vector.extend(r.vector.tolist())
    return item


def _fill_hit(pb: search_pb2.Hit, h: Hit) -> None:
    """`pb` (a hit just added to its response) set from `h`. Searches add up to top_k of
    these: built in place, where a Hit built apart would be copied into the response."""
    # None stays unset: "not computed by this mode" differs from a score of 0. Fields at
    # their defaults are left out: each costs even when it sets nothing.
    pb.id, pb.score = h.id, h.score
    if h.text:
        pb.text = h.text
    for field, value in (("dense_score", h.dense), ("lexical_score", h.lexical),
                         ("fused_score", h.fused)):  # fmt: skip
        if value is not None:
            setattr(pb, field, value)
    if h.metadata:
        pb.metadata.CopyFrom(dict_to_struct(h.metadata))
    else:
        pb.metadata.SetInParent()  # present and empty, as every hit always had it
    if h.chunks:
        pb.chunks.extend(chunk_hits_to_pb(h.chunks))


def hit_to_pb(h: Hit) -> search_pb2.Hit:
    pb = search_pb2.Hit()
    _fill_hit(pb, h)
    return pb


def _optional(pb: Any, name: str) -> float | None:
    return getattr(pb, name) if pb.HasField(name) else None


def hit_from_pb(pb: search_pb2.Hit) -> Hit:
    return Hit(
        id=pb.id,
        score=pb.score,
        text=pb.text,
        metadata=struct_to_dict(pb.metadata),
        dense=_optional(pb, "dense_score"),
        lexical=_optional(pb, "lexical_score"),
        fused=_optional(pb, "fused_score"),
        chunks=chunk_hits_from_pb(pb.chunks),
    )


def search_result_to_pb(r: SearchResult, embedder: str = "") -> search_pb2.SearchResponse:
    pb = search_pb2.SearchResponse(returned_k=r.returned_k, exhaustive=r.exhaustive,
                                   embedder=embedder)  # fmt: skip
    add = pb.hits.add
    for h in r.hits:
        _fill_hit(add(), h)
    for g in r.groups:
        group = pb.groups.add()
        group.key.CopyFrom(value_to_pb(g.key))
        for h in g.hits:
            _fill_hit(group.hits.add(), h)
    return pb


def search_result_from_pb(pb: search_pb2.SearchResponse) -> SearchResult:
    return SearchResult(
        hits=[hit_from_pb(h) for h in pb.hits], returned_k=pb.returned_k, exhaustive=pb.exhaustive
    )


# --- memory ----------------------------------------------------------------------------


def memory_to_pb(m: Memory) -> memory_pb2.Memory:
    return memory_pb2.Memory(
        id=m.id,
        namespace=m.namespace,
        text=m.text,
        metadata=dict_to_struct(m.metadata),
        importance=m.importance,
        created_at=m.created_at,
        updated_at=m.updated_at,
        expires_at=m.expires_at,
        score=m.score,
        parts=memory_pb2.ScoreParts(
            relevance=m.relevance,
            recency=m.recency,
            importance=m.importance,
            dense=m.dense,
            lexical=m.lexical,
            fused=m.fused,
        ),
    )


def memory_from_pb(pb: memory_pb2.Memory) -> Memory:
    return Memory(
        id=pb.id,
        namespace=pb.namespace,
        text=pb.text,
        metadata=struct_to_dict(pb.metadata),
        importance=pb.importance,
        created_at=pb.created_at,
        updated_at=pb.updated_at,
        expires_at=pb.expires_at,
        score=pb.score,
        relevance=pb.parts.relevance,
        recency=pb.parts.recency,
        dense=_optional(pb.parts, "dense"),
        lexical=_optional(pb.parts, "lexical"),
        fused=_optional(pb.parts, "fused"),
    )


# --- admin -----------------------------------------------------------------------------


def rebuild_progress_to_pb(p: RebuildProgress) -> admin_pb2.RebuildProgress:
    return admin_pb2.RebuildProgress(
        phase=p.phase,
        done=p.done,
        total=p.total,
        rate=p.rate,
        eta_seconds=p.eta_seconds,
        generation=p.generation,
        recall=p.recall or 0.0,
        message=p.message,
    )


def key_info_to_pb(k: KeyInfo) -> admin_pb2.KeyInfo:
    return admin_pb2.KeyInfo(
        key_id=k.key_id,
        tenant=k.tenant,
        scopes=list(k.scopes),
        description=k.description,
        created_at=k.created_at,
        revoked=k.revoked,
    )


def shadow_summary_to_pb(c: CaseStatus) -> admin_pb2.ShadowCaseSummary:
    return admin_pb2.ShadowCaseSummary(
        use_case=c.use_case,
        status=c.status,
        serving=c.serving,
        shadow=c.shadow if c.serving != c.shadow else c.canonical,
        flip_eligible=c.flip_eligible,
    )


def _gates_to_pb(gates) -> list[admin_pb2.GateResult]:
    return [admin_pb2.GateResult(**dataclasses.asdict(g)) for g in gates]


def _gates_from_pb(gates) -> tuple[GateResult, ...]:
    return tuple(GateResult(g.name, g.passed, g.value, g.missing) for g in gates)


_LISTS = ("gates", "releases", "history", "watch", "watch_releases")
_CASE_FIELDS = [f.name for f in dataclasses.fields(CaseStatus) if f.name not in _LISTS]


def shadow_case_to_pb(c: CaseStatus) -> admin_pb2.ShadowCase:
    return admin_pb2.ShadowCase(
        **{k: getattr(c, k) for k in _CASE_FIELDS},
        gates=_gates_to_pb(c.gates),
        releases=[release_evidence_to_pb(r) for r in c.releases],
        history=[admin_pb2.FlipEvent(**dataclasses.asdict(h)) for h in c.history],
        watch=_gates_to_pb(c.watch),
        watch_releases=[release_evidence_to_pb(r) for r in c.watch_releases],
    )


def shadow_case_from_pb(pb: admin_pb2.ShadowCase) -> CaseStatus:
    return CaseStatus(
        **{k: getattr(pb, k) for k in _CASE_FIELDS},
        gates=_gates_from_pb(pb.gates),
        releases=tuple(release_evidence_from_pb(r) for r in pb.releases),
        history=tuple(FlipEvent(h.at, h.action, h.serving, h.forced, h.reason) for h in pb.history),
        watch=_gates_from_pb(pb.watch),
        watch_releases=tuple(release_evidence_from_pb(r) for r in pb.watch_releases),
    )


_CLASS_FIELDS = [f.name for f in dataclasses.fields(ClassEvidence)]
_EVIDENCE_FIELDS = [f.name for f in dataclasses.fields(ReleaseEvidence) if f.name != "classes"]


def release_evidence_to_pb(r: ReleaseEvidence) -> admin_pb2.ReleaseEvidence:
    return admin_pb2.ReleaseEvidence(
        **{k: getattr(r, k) for k in _EVIDENCE_FIELDS},
        classes=[
            admin_pb2.ClassEvidence(**{k: getattr(c, k) for k in _CLASS_FIELDS}) for c in r.classes
        ],
    )


def release_evidence_from_pb(pb: admin_pb2.ReleaseEvidence) -> ReleaseEvidence:
    return ReleaseEvidence(
        **{k: getattr(pb, k) for k in _EVIDENCE_FIELDS},
        classes=tuple(
            ClassEvidence(**{k: getattr(c, k) for k in _CLASS_FIELDS}) for c in pb.classes
        ),
    )


def record_release_to_pb(rec: ReleaseRecord, replaced: bool, history: str):
    return admin_pb2.RecordReleaseResponse(
        evidence=release_evidence_to_pb(rec.evidence),
        replaced=replaced,
        history=history,
        machine=rec.machine,
        key_id=rec.key_id,
    )
