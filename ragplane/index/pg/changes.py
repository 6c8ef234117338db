"""The change log's operations: one frozen dataclass each, which encodes itself as the JSON
of its `rp_changes` row, decodes from it (`decode`, through the `OPS` registry) and applies
itself to a server's cache.

Every operation names its collection (`tenant`, `kind`: collection or memory namespace,
`name`). Applying is idempotent (a replace, a delete, a create of what exists is skipped):
a cache may apply a change twice after a crash. An upsert's items are not in the log: they
are read from `rp_items` at the change's position (`PgStore.items`), so the log stays small
and the items are written once."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from ragplane.core.errors import AlreadyExists, FailedPrecondition, NotFound
from ragplane.index.engine import Engine
from ragplane.index.pg import codec
from ragplane.index.types import Chunking, IndexParams, IndexType, Kind, Metric, Record

log = logging.getLogger(__name__)


class Source(Protocol):
    """What applying reads from the shared store besides the log (a `PgStore`)."""

    def items(self, tenant: str, kind: str, coll: str, pos: int, dim: int) -> list[Record]: ...

    def embeddings(self, embedder: str, texts: list[str]) -> list[bytes | None]: ...


@dataclass(frozen=True)
class CollectionConfig:
    """A collection's configuration as `rp_collections.config` and a create hold it."""

    dim: int
    metric: Metric
    index_type: IndexType
    embedder: str
    params: IndexParams
    lexical_index: bool
    chunking: Chunking

    def to_json(self) -> dict[str, Any]:
        return {
            "dim": self.dim, "metric": self.metric.value, "index_type": self.index_type.value,
            "embedder": self.embedder, "params": codec.params_to_json(self.params),
            "lexical_index": self.lexical_index, "chunking": codec.chunking_to_json(self.chunking),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CollectionConfig:
        """From a create's or a config row's JSON (other keys, such as the generation a
        re-embedding made, are left out)."""
        return cls(
            int(d["dim"]), Metric(d["metric"]), IndexType(d["index_type"]), str(d["embedder"]),
            codec.params_from_json(d["params"]) or IndexParams(), bool(d["lexical_index"]),
            codec.chunking_from_json(d["chunking"]),
        )


@dataclass(frozen=True)
class Op:
    """One logged write to the collection (tenant, kind, name)."""

    NAME: ClassVar[str]
    tenant: str
    kind: Kind
    name: str

    def encode(self) -> dict[str, Any]:
        """The row's JSON: `op` (which operation), the collection, then its own fields."""
        return {"op": self.NAME, "tenant": self.tenant, "kind": self.kind.value,
                "name": self.name, **self._fields()}

    def _fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def _decode(cls, base: dict[str, Any], d: Mapping[str, Any]) -> Op:
        return cls(**base)

    def apply(self, engine: Engine, source: Source, pos: int) -> None:
        """This change on the cache `engine`; a collection a later change dropped is
        skipped (NotFound)."""
        with contextlib.suppress(NotFound):
            self._apply(engine.of_kind(self.kind), source, pos)

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        raise NotImplementedError


OPS: dict[str, type[Op]] = {}
OpT = TypeVar("OpT", bound=Op)


def _op(cls: type[OpT]) -> type[OpT]:
    """Registers an operation under its NAME, which its log rows carry as `op`."""
    OPS[cls.NAME] = cls
    return cls


def decode(d: Mapping[str, Any]) -> Op:
    """The operation a log row's JSON holds; ValueError for one this server does not know."""
    cls = OPS.get(str(d.get("op")))
    if cls is None:
        raise ValueError(f"unknown operation {d.get('op')!r} in the change log")
    base = {"tenant": str(d["tenant"]), "kind": Kind(d["kind"]), "name": str(d["name"])}
    return cls._decode(base, d)


@_op
@dataclass(frozen=True)
class Create(Op):
    NAME: ClassVar[str] = "create"
    config: CollectionConfig

    def _fields(self) -> dict[str, Any]:
        return self.config.to_json()

    @classmethod
    def _decode(cls, base: dict[str, Any], d: Mapping[str, Any]) -> Op:
        return cls(**base, config=CollectionConfig.from_json(d))

    def apply(self, engine: Engine, source: Source, pos: int) -> None:
        cfg = self.config
        with contextlib.suppress(AlreadyExists):
            engine.of_kind(self.kind).create_collection(
                self.tenant, self.name, dim=cfg.dim, metric=cfg.metric,
                index_type=cfg.index_type, embedder=cfg.embedder, params=cfg.params,
                lexical_index=cfg.lexical_index, chunking=cfg.chunking,
            )


@_op
@dataclass(frozen=True)
class Drop(Op):
    NAME: ClassVar[str] = "drop"

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        view.delete_collection(self.tenant, self.name)


@_op
@dataclass(frozen=True)
class Upsert(Op):
    """Items written at this position (in `rp_items`); `dim` decodes their vectors."""

    NAME: ClassVar[str] = "upsert"
    dim: int
    count: int

    def _fields(self) -> dict[str, Any]:
        return {"dim": self.dim, "count": self.count}

    @classmethod
    def _decode(cls, base: dict[str, Any], d: Mapping[str, Any]) -> Op:
        return cls(**base, dim=int(d["dim"]), count=int(d.get("count", 0)))

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        records = source.items(self.tenant, self.kind.value, self.name, pos, self.dim)
        if records:  # none: all replaced, deleted (or the collection dropped) since
            view.upsert(self.tenant, self.name, records)


@_op
@dataclass(frozen=True)
class Delete(Op):
    NAME: ClassVar[str] = "delete"
    ids: tuple[str, ...]

    def _fields(self) -> dict[str, Any]:
        return {"ids": list(self.ids)}

    @classmethod
    def _decode(cls, base: dict[str, Any], d: Mapping[str, Any]) -> Op:
        return cls(**base, ids=tuple(str(i) for i in d["ids"]))

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        view.delete(self.tenant, self.name, ids=list(self.ids))


@_op
@dataclass(frozen=True)
class SetEmbedder(Op):
    NAME: ClassVar[str] = "embedder"
    embedder: str

    def _fields(self) -> dict[str, Any]:
        return {"embedder": self.embedder}

    @classmethod
    def _decode(cls, base: dict[str, Any], d: Mapping[str, Any]) -> Op:
        return cls(**base, embedder=str(d["embedder"]))

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        view.set_embedder(self.tenant, self.name, self.embedder)


@_op
@dataclass(frozen=True)
class Rollback(Op):
    """A server without the previous generation (loaded from the tables since) keeps its
    current one and says so in its log."""

    NAME: ClassVar[str] = "rollback"

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        try:
            view.rollback(self.tenant, self.name)
        except FailedPrecondition as exc:
            log.warning("rollback of %s/%s not applied here: %s", self.tenant, self.name, exc)


@_op
@dataclass(frozen=True)
class Rebuild(Op):
    """A new generation of `index_type`; `reembed`: from the vectors the server that ran
    it stored for `embedder` (`rp_embeddings`), never embedded again here."""

    NAME: ClassVar[str] = "rebuild"
    index_type: IndexType
    params: IndexParams | None = None
    min_recall: float = 0.0
    reembed: bool = False
    embedder: str | None = None

    def _fields(self) -> dict[str, Any]:
        return {
            "index_type": self.index_type.value, "min_recall": self.min_recall,
            "params": None if self.params is None else codec.params_to_json(self.params),
            "reembed": self.reembed, "embedder": self.embedder,
        }

    @classmethod
    def _decode(cls, base: dict[str, Any], d: Mapping[str, Any]) -> Op:
        embedder = d.get("embedder")
        return cls(
            **base, index_type=IndexType(d["index_type"]),
            params=codec.params_from_json(d.get("params")),
            min_recall=float(d.get("min_recall", 0.0)), reembed=bool(d.get("reembed")),
            embedder=None if embedder is None else str(embedder),
        )

    def _apply(self, view: Engine, source: Source, pos: int) -> None:
        again = _stored(source, self.embedder) if self.reembed and self.embedder else None
        view.rebuild(
            self.tenant, self.name, index_type=self.index_type, params=self.params,
            min_recall=self.min_recall, reembed=again, embedder=self.embedder,
        )


def _stored(source: Source, embedder: str) -> Any:
    """A re-embedder that returns the vectors another server stored for `embedder`."""

    def reembed(texts: list[str]) -> np.ndarray:
        found = source.embeddings(embedder, texts)
        missing = sum(v is None for v in found)
        if missing:
            raise FailedPrecondition(
                f"{missing} of {len(texts)} re-embedded vectors of {embedder} are not in the "
                "store; the server reloads its indexes from the tables"
            )
        return np.stack([np.frombuffer(v, dtype="<f4") for v in found if v is not None])

    return reembed

