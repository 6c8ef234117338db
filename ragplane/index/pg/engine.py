"""`PgEngine`: the store (`ragplane.index.backend.Store`) over PostgreSQL, for the server.

Reads go to this server's cache (its local Engine, which `LogFollower` keeps at the log's
head). A write is checked against the cache at the position just before its own (the head
lock is held: nothing else can commit meanwhile, so the check is exact), written to
PostgreSQL with its change (`changes.Op`), committed (the acknowledgement), and then
applied here before it returns. An upsert, the write that comes in volume, overlaps the
two: its statements go out once the collection is found in the cache, and PostgreSQL runs
them while the items are checked and written here in an open transaction, committed after
PostgreSQL's (`pg.upsert`: one path that drives both)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from ragplane.core.errors import AlreadyExists, FailedPrecondition, NotFound
from ragplane.index import catalog
from ragplane.index.engine import Engine
from ragplane.index.pg import changes, codec
from ragplane.index.pg import reembed as reembed_mod
from ragplane.index.pg.changes import CollectionConfig, Op
from ragplane.index.pg.follower import LogFollower
from ragplane.index.pg.log import Change, budget
from ragplane.index.pg.upsert import PgUpsert
from ragplane.index.progress import RebuildProgress
from ragplane.index.types import (
    Chunking,
    CollectionInfo,
    Filter,
    Fusion,
    IndexParams,
    IndexType,
    Kind,
    Metric,
    Record,
    SearchKnobs,
    SearchResult,
)
from ragplane.index.writes import check_delete

log = logging.getLogger(__name__)

T = TypeVar("T")
Conn = psycopg.Connection[Any]


class _NothingToLog(Exception):
    """Raised inside a write that changes nothing: its transaction rolls back."""


class PgEngine:
    """The server's store when the truth is PostgreSQL (see the module docstring)."""

    def __init__(self, follower: LogFollower, kind: Kind = Kind.COLLECTION) -> None:
        self.follower = follower
        self.kind = kind

    @property
    def local(self) -> Engine:
        """This server's cache, seeing the collections of this engine's kind."""
        return self.follower.engine.of_kind(self.kind)

    def of_kind(self, kind: Kind) -> PgEngine:
        return PgEngine(self.follower, kind)

    def position(self) -> int:
        return self.follower.applied

    def run_once(self, name: str) -> contextlib.AbstractContextManager[bool]:
        """Work that must run once in the cluster: PostgreSQL's advisory lock `name`."""
        return self.follower.store.lease(f"once/{name}")

    def close(self) -> None:
        self.follower.close()

    def __enter__(self) -> PgEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reads (the cache)

    def _read(self, call: Callable[[Engine], T]) -> T:
        """A collection this server has not seen may have been made on another one a
        moment ago: before saying NOT_FOUND, catch up with the log and look again."""
        try:
            return call(self.local)
        except NotFound:
            with budget():
                self.follower.catch_up()
            return call(self.local)

    def list_collections(self, tenant: str) -> list[CollectionInfo]:
        return self._read(lambda e: e.list_collections(tenant))

    def list_all_collections(self) -> list[CollectionInfo]:
        return self._read(lambda e: e.list_all_collections())

    def describe(self, tenant: str, name: str) -> CollectionInfo:
        return self._read(lambda e: e.describe(tenant, name))

    def scan_size(self, tenant: str, name: str) -> int:
        return self._read(lambda e: e.scan_size(tenant, name))

    def get(self, tenant: str, name: str, ids: Sequence[str], *,
            include_vectors: bool = False) -> list[Record]:
        return self._read(lambda e: e.get(tenant, name, ids, include_vectors=include_vectors))

    def live_among(self, tenant: str, name: str, ids: Sequence[str]) -> set[str]:
        return self._read(lambda e: e.live_among(tenant, name, ids))

    def iter_records(self, tenant: str, name: str, batch: int = 1024) -> Iterator[list[Record]]:
        return self._read(lambda e: e.iter_records(tenant, name, batch))

    def page(self, tenant: str, name: str, *, order_by: str,
             after: tuple[Any, str] | None = None, limit: int,
             filter: Filter | None = None) -> list[Record]:
        return self._read(lambda e: e.page(tenant, name, order_by=order_by, after=after,
                                           limit=limit, filter=filter))

    def ids_matching(self, tenant: str, name: str, filter: Filter) -> list[str]:
        return self._read(lambda e: e.ids_matching(tenant, name, filter))

    def count_matching(self, tenant: str, name: str, filter: Filter | None) -> int:
        return self._read(lambda e: e.count_matching(tenant, name, filter))

    def search(self, tenant: str, name: str, queries: np.ndarray, top_k: int, *,
               filter: Filter | None = None, include_text: bool = False,
               include_metadata: bool = False, chunks_per_hit: int = 1,
               knobs: SearchKnobs | None = None) -> list[SearchResult]:
        return self._read(lambda e: e.search(
            tenant, name, queries, top_k, filter=filter, include_text=include_text,
            include_metadata=include_metadata, chunks_per_hit=chunks_per_hit, knobs=knobs))

    def search_lexical(self, tenant: str, name: str, text: str, top_k: int, *,
                       filter: Filter | None = None, include_text: bool = False,
                       include_metadata: bool = False, chunks_per_hit: int = 1) -> SearchResult:
        return self._read(lambda e: e.search_lexical(
            tenant, name, text, top_k, filter=filter, include_text=include_text,
            include_metadata=include_metadata, chunks_per_hit=chunks_per_hit))

    def search_hybrid(self, tenant: str, name: str, text: str, vector: np.ndarray,
                      top_k: int, *, fusion: Fusion = Fusion(),  # noqa: B008 - frozen
                      filter: Filter | None = None, include_text: bool = False,
                      include_metadata: bool = False, chunks_per_hit: int = 1) -> SearchResult:
        return self._read(lambda e: e.search_hybrid(
            tenant, name, text, vector, top_k, fusion=fusion, filter=filter,
            include_text=include_text, include_metadata=include_metadata,
            chunks_per_hit=chunks_per_hit))

    def compact(self, tenant: str, name: str | None = None) -> int:
        """Drops tombstoned rows of this server's cache only: derived data, not logged."""
        return self._read(lambda e: e.compact(tenant, name))

    def snapshot(self, dest_dir: str | os.PathLike[str],
                 also: Callable[[Path], int] | None = None) -> int:
        """A consistent copy of this server's cache at the position it has applied: an
        embedded store (serve it with store=sqlite, or copy it elsewhere). The truth stays
        in PostgreSQL: back that up there (pg_dump, a standby, point-in-time recovery)."""
        with self.follower.lock:  # nothing is applied meanwhile: one position throughout
            return self.follower.engine.snapshot(dest_dir, also)

    # ------------------------------------------------------------------ the write path

    def _write(self, stage: Callable[[Conn, int], Op],
               own: Callable[[], None] | None = None) -> Op | None:
        """One write at the next position. `stage(connection, position)` runs after the
        cache has caught up to the position before it: it checks the request against the
        cache, changes the state tables and returns the operation to log (or raises
        _NothingToLog). After the commit the change is applied here; with `own`, the
        change is already in effect here (a rebuild, which waits as long as it must) and
        `own` runs under the follower's lock instead. Other writes wait within a call's
        budget. Returns the operation logged (None: nothing was)."""
        with contextlib.nullcontext() if own is not None else budget():
            return self._write_now(stage, own)

    def _write_now(self, stage: Callable[[Conn, int], Op],
                   own: Callable[[], None] | None) -> Op | None:
        fol = self.follower
        with fol.locked():
            fol.check()
            op: Op | None = None
            try:
                with fol.store.write() as (c, pos):
                    if fol.applied != pos - 1:  # another server wrote since: apply it first
                        fol.catch_up(pos - 1)
                    op = stage(c, pos)
                    fol.store.append(c, op, pos)
                    fol.writing = pos
            except _NothingToLog:
                return None
            except BaseException as exc:
                fol.writing = 0  # if it did not commit, the position is the next write's
                if own is not None and op is not None:  # changed here, maybe not in PostgreSQL
                    fol.broken = f"{op.NAME} of {op.name!r} may not have committed: {exc}"
                raise
            assert op is not None
            if own is not None:
                try:
                    own()
                except Exception as exc:  # committed, so acknowledged; this cache reloads
                    fol.broken = f"{op.NAME} at position {pos} was not applied here: {exc}"
                    log.exception("applying position %d here failed", pos)
                fol.advance(pos)
            else:
                fol.apply(Change(pos, op))
            return op

    def _exists(self, tenant: str, name: str) -> bool:
        try:
            self.local.describe(tenant, name)
        except NotFound:
            return False
        return True

    # ------------------------------------------------------------------ collections

    def create_collection(
        self, tenant: str, name: str, *, dim: int, metric: Metric, index_type: IndexType,
        embedder: str, params: IndexParams = IndexParams(),  # noqa: B008 - frozen
        lexical_index: bool = True, chunking: Chunking = Chunking(),  # noqa: B008 - frozen
    ) -> CollectionInfo:
        dim, metric, index_type, params = catalog.checked(
            tenant, name, dim, metric, index_type, params, embedder
        )
        config = CollectionConfig(dim, metric, index_type, embedder, params,
                                  bool(lexical_index), chunking)

        def stage(c: Conn, pos: int) -> Op:
            if self._exists(tenant, name):
                raise AlreadyExists(
                    f"collection {name!r} already exists; pick another name or delete it first"
                )
            c.execute(
                "INSERT INTO rp_collections (tenant, kind, name, config) VALUES (%s, %s, %s, %s)",
                (tenant, self.kind.value, name, Jsonb(config.to_json())),
            )
            return changes.Create(tenant, self.kind, name, config)

        self._write(stage)
        return self.local.describe(tenant, name)

    def delete_collection(self, tenant: str, name: str) -> None:
        def stage(c: Conn, pos: int) -> Op:
            self.local.describe(tenant, name)  # NotFound
            key = (tenant, self.kind.value, name)
            c.execute("DELETE FROM rp_items WHERE tenant = %s AND kind = %s AND coll = %s", key)
            c.execute(
                "DELETE FROM rp_collections WHERE tenant = %s AND kind = %s AND name = %s", key
            )
            return changes.Drop(tenant, self.kind, name)

        self._write(stage)

    def set_embedder(self, tenant: str, name: str, embedder: str) -> None:
        embedder = catalog.check_embedder(embedder)

        def stage(c: Conn, pos: int) -> Op:
            self.local.describe(tenant, name)
            self._set_config(c, tenant, name, {"embedder": embedder})
            return changes.SetEmbedder(tenant, self.kind, name, embedder)

        self._write(stage)

    def _set_config(self, c: Conn, tenant: str, name: str, change: dict[str, Any]) -> None:
        c.execute(
            "UPDATE rp_collections SET config = config || %s WHERE tenant = %s AND kind = %s "
            "AND name = %s",
            (Jsonb(change), tenant, self.kind.value, name),
        )

    # ------------------------------------------------------------------ items

    def upsert(self, tenant: str, name: str, records: Sequence[Record]) -> int:
        """See `ragplane.index.pg.upsert.PgUpsert`: sent ahead, at most twice."""
        return PgUpsert(self.follower, self.kind, tenant, name, list(records)).run()

    def delete(
        self, tenant: str, name: str, *, ids: Sequence[str] | None = None,
        filter: Filter | None = None,
    ) -> int:
        wanted, matching = check_delete(ids, filter)

        def stage(c: Conn, pos: int) -> Op:
            if wanted is not None:
                live = sorted({r.id for r in self.local.get(tenant, name, wanted)})
            else:
                assert matching is not None
                live = self.local.ids_matching(tenant, name, matching)
            if not live:
                raise _NothingToLog
            c.execute(
                "DELETE FROM rp_items WHERE tenant = %s AND kind = %s AND coll = %s "
                "AND id = ANY(%s)",
                (tenant, self.kind.value, name, live),
            )
            return changes.Delete(tenant, self.kind, name, tuple(live))

        op = self._write(stage)
        return len(op.ids) if isinstance(op, changes.Delete) else 0

    # ------------------------------------------------------------------ generations

    def rebuild(
        self, tenant: str, name: str, *, index_type: IndexType | None = None,
        params: IndexParams | None = None,
        reembed: Callable[[list[str]], np.ndarray] | None = None,
        embedder: str | None = None, min_recall: float = 0.95,
        progress: Callable[[RebuildProgress], None] | None = None,
    ) -> CollectionInfo:
        """Built here (recall checked here), then logged: the other servers build the
        same generation from the same rows when they reach it. One rebuild of a collection
        at a time in the cluster (an advisory lock)."""
        with self.follower.store.lease(f"rebuild/{tenant}/{self.kind.value}/{name}") as got:
            if not got:
                raise FailedPrecondition(
                    f"a rebuild of {name!r} is running on another server; wait for it"
                )
            if reembed is not None or embedder is not None:
                self._rebuild_reembed(tenant, name, index_type, params, reembed, embedder,
                                      min_recall, progress)
                return self.local.describe(tenant, name)
            before = self.local.describe(tenant, name).index_type
            info = self.local.rebuild(
                tenant, name, index_type=index_type, params=params, min_recall=min_recall,
                progress=progress,
            )
            config = _rebuild_config(before, info, params)

            def stage(c: Conn, pos: int) -> Op:
                self._set_config(c, tenant, name, config)
                # params None: every server keeps the collection's own, as this one did
                return changes.Rebuild(tenant, self.kind, name, info.index_type, params)

            self._write(stage, own=lambda: None)
        return self.local.describe(tenant, name)

    def _rebuild_reembed(
        self, tenant: str, name: str, index_type: IndexType | None,
        params: IndexParams | None, reembed: Callable[[list[str]], np.ndarray] | None,
        embedder: str | None, min_recall: float,
        progress: Callable[[RebuildProgress], None] | None,
    ) -> None:
        """A re-embedding rebuild runs inside its write: other writes wait within their
        budget, then are refused with retry-after (searches go on), so every server
        re-embeds exactly the rows of one position."""
        recording = reembed_mod.Recording(reembed) if reembed is not None else None

        def stage(c: Conn, pos: int) -> Op:
            before = self.local.describe(tenant, name).index_type
            info = self.local.rebuild(
                tenant, name, index_type=index_type, params=params, reembed=recording,
                embedder=embedder, min_recall=min_recall, progress=progress,
            )
            config = {**_rebuild_config(before, info, params), "embedder": info.embedder,
                      "dim": info.dim, "reembedded_generation": info.generation}
            if recording is not None:
                self.follower.store.put_embeddings(c, info.embedder, recording.vectors)
                reembed_mod.revector_items(c, (tenant, self.kind.value, name),
                                           recording.vectors, info.embedder)
            self._set_config(c, tenant, name, config)
            return changes.Rebuild(tenant, self.kind, name, info.index_type, params,
                                   reembed=recording is not None, embedder=info.embedder)

        self._write(stage, own=lambda: None)

    def rollback(self, tenant: str, name: str) -> CollectionInfo:
        """Rolled back here inside the write's transaction (a refusal rolls it back), then
        logged; a server without the previous generation (its cache was loaded from the
        tables since) keeps its current one and says so in its log."""
        def stage(c: Conn, pos: int) -> Op:
            row = c.execute(
                "SELECT config FROM rp_collections WHERE tenant = %s AND kind = %s AND name = %s",
                (tenant, self.kind.value, name),
            ).fetchone()
            config = row[0] if row else None
            info = self.local.describe(tenant, name)
            if config and config.get("reembedded_generation") == info.generation:
                raise FailedPrecondition(
                    f"{name!r} was re-embedded by its last rebuild: with a PostgreSQL store "
                    "that cannot be rolled back; rebuild it again with the previous embedder"
                )
            self.local.rollback(tenant, name)
            return changes.Rollback(tenant, self.kind, name)

        self._write(stage, own=lambda: None)
        return self.local.describe(tenant, name)


def _rebuild_config(
    before: IndexType, info: CollectionInfo, params: IndexParams | None
) -> dict[str, Any]:
    """The collection's config after a rebuild, as `Engine.rebuild` chose its params: those
    asked for, else the collection's own (kept: not written) for the same index type, else
    the defaults."""
    config: dict[str, Any] = {"index_type": info.index_type.value}
    if params is not None or info.index_type != before:
        config["params"] = _params_json(params or IndexParams())
    return config


def _params_json(params: IndexParams) -> dict[str, int]:
    return codec.params_to_json(params)
