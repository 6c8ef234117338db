"""`SharedEngine`: the Engine's face over a PostgreSQL store, for the server.

Reads go to this server's replica (its local Engine). A write is checked against the
replica at the position just before its own (the head lock is held: nothing else can
commit meanwhile, so the check is exact), written to PostgreSQL with its change, committed
(the acknowledgement), and then applied here before it returns. An upsert, the write that
comes in volume, overlaps the two: its statements go out first and PostgreSQL runs them
while the items are checked and written here in an open transaction, committed after
PostgreSQL's (upsert's docstring)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from ragplane.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from ragplane.index import catalog
from ragplane.index.engine import Engine
from ragplane.index.pg import codec
from ragplane.index.pg import reembed as reembed_mod
from ragplane.index.pg import upsert_sql as sql
from ragplane.index.pg.log import Change, budget
from ragplane.index.pg.replica import Replica
from ragplane.index.types import (
    Chunking,
    CollectionInfo,
    Filter,
    IndexParams,
    IndexType,
    Kind,
    Metric,
    Record,
)
from ragplane.index.validate import check_ids

log = logging.getLogger(__name__)

class _NothingToLog(Exception):
    """Raised inside a write that changes nothing: its transaction rolls back."""


class SharedEngine:
    """The server's engine when the store is PostgreSQL (see the module docstring)."""

    def __init__(self, replica: Replica, kind: Kind = Kind.COLLECTION) -> None:
        self.replica = replica
        self.kind = kind

    @property
    def local(self) -> Engine:
        return self.replica.engine.of_kind(self.kind)

    def __getattr__(self, name: str) -> Any:  # reads: get, search, describe, page, ...
        if name.startswith("__") or "replica" not in self.__dict__:
            raise AttributeError(name)
        attr = getattr(self.local, name)
        if not callable(attr):
            return attr

        def read(*args: Any, **kwargs: Any) -> Any:
            """A collection this server has not seen may have been made on another one a
            moment ago: before saying NOT_FOUND, catch up with the log and look again."""
            try:
                return attr(*args, **kwargs)
            except NotFound:
                with budget():
                    self.replica.catch_up()
                return getattr(self.local, name)(*args, **kwargs)

        return read

    def of_kind(self, kind: Kind) -> SharedEngine:
        return SharedEngine(self.replica, kind)

    def position(self) -> int:
        return self.replica.applied

    def run_once(self, name: str) -> Any:
        """Work that must run once in the cluster: PostgreSQL's advisory lock `name`."""
        return self.replica.store.lease(f"once/{name}")

    def close(self) -> None:
        self.replica.close()

    def __enter__(self) -> SharedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the write path

    def _write(
        self, op: dict[str, Any], stage: Callable[[Any, int], bytes | None],
        own: Callable[[], None] | None = None,
    ) -> None:
        """One write at the next position. `stage(connection, position)` runs after the replica has
        caught up to the position before it: it checks the request against the replica,
        changes the state tables, may fill in `op`, and returns the vectors' blob. After
        the commit the change is applied here; with `own`, the change is already in effect
        here (a rebuild, which waits as long as it must) and `own` runs under the
        replica's lock instead. Other writes wait within a call's budget."""
        with contextlib.nullcontext() if own is not None else budget():
            self._write_now(op, stage, own)

    def _write_now(
        self, op: dict[str, Any], stage: Callable[[Any, int], bytes | None],
        own: Callable[[], None] | None,
    ) -> None:
        rep = self.replica
        op["kind"] = self.kind.value
        with rep.locked():
            rep.check()
            staged = False
            try:
                with rep.store.write() as (c, pos):
                    if rep.applied != pos - 1:  # another server wrote since: apply it first
                        rep.catch_up(pos - 1)
                    blob = stage(c, pos) or b""
                    staged = True
                    rep.store.append(c, op, blob, pos)
                    rep.writing = pos
            except _NothingToLog:
                return
            except BaseException as exc:
                rep.writing = 0  # if it did not commit, the position is the next write's
                if own is not None and staged:  # changed here, maybe not in PostgreSQL
                    rep.broken = f"{op['op']} of {op.get('name')!r} may not have committed: {exc}"
                raise
            if own is not None:
                try:
                    own()
                except Exception as exc:  # committed, so acknowledged; this cache reloads
                    rep.broken = f"{op['op']} at position {pos} was not applied here: {exc}"
                    log.exception("applying position %d here failed", pos)
                rep.advance(pos)
            else:
                rep.apply(Change(pos, op, blob))

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
        config = {
            "dim": dim, "metric": metric.value, "index_type": index_type.value,
            "embedder": embedder, "params": codec.params_to_json(params),
            "lexical_index": bool(lexical_index), "chunking": codec.chunking_to_json(chunking),
        }

        def stage(c: Any, pos: int) -> None:
            if self._exists(tenant, name):
                raise AlreadyExists(
                    f"collection {name!r} already exists; pick another name or delete it first"
                )
            c.execute(
                "INSERT INTO rp_collections (tenant, kind, name, config) VALUES (%s, %s, %s, %s)",
                (tenant, self.kind.value, name, Jsonb(config)),
            )

        self._write({"op": "create", "tenant": tenant, "name": name, **config}, stage)
        return self.local.describe(tenant, name)

    def delete_collection(self, tenant: str, name: str) -> None:
        def stage(c: Any, pos: int) -> None:
            self.local.describe(tenant, name)  # NotFound
            key = (tenant, self.kind.value, name)
            c.execute("DELETE FROM rp_items WHERE tenant = %s AND kind = %s AND coll = %s", key)
            c.execute(
                "DELETE FROM rp_collections WHERE tenant = %s AND kind = %s AND name = %s", key
            )

        self._write({"op": "drop", "tenant": tenant, "name": name}, stage)

    def set_embedder(self, tenant: str, name: str, embedder: str) -> None:
        if not isinstance(embedder, str) or not embedder:
            raise InvalidArgument("embedder must be a non-empty string (name@version)")

        def stage(c: Any, pos: int) -> None:
            self.local.describe(tenant, name)
            self._set_config(c, tenant, name, {"embedder": embedder})

        self._write({"op": "embedder", "tenant": tenant, "name": name, "embedder": embedder},
                    stage)

    def _set_config(self, c: Any, tenant: str, name: str, change: dict[str, Any]) -> None:
        c.execute(
            "UPDATE rp_collections SET config = config || %s WHERE tenant = %s AND kind = %s "
            "AND name = %s",
            (Jsonb(change), tenant, self.kind.value, name),
        )

    # ------------------------------------------------------------------ items

    def upsert(self, tenant: str, name: str, records: Sequence[Record]) -> int:
        """Sent to PostgreSQL ahead (`_upsert_ahead`); when another server wrote first
        (its position, or ids new here that it added), sent again holding the head's
        lock (`_upsert_locked`), which no other write can overtake: two sends at most,
        and a client sees no conflict. The items are written once, to rp_items at this
        change's position, where the other servers read them."""
        records = list(records)
        rep = self.replica
        with budget():
            try:
                self.local.describe(tenant, name)
            except NotFound:  # made on another server a moment ago?
                rep.catch_up()
            dim = self.local.describe(tenant, name).dim
            args = self._encoded(tenant, name, records)
            op = {"op": "upsert", "tenant": tenant, "name": name, "kind": self.kind.value,
                  "dim": dim, "count": len(records)}
            with rep.locked():
                rep.check()
                try:
                    rep.advance(self._upsert_ahead(tenant, name, records, op, args))
                    return len(records)
                except sql.Behind:  # nothing committed: again, first in line
                    pass
            self._upsert_locked(tenant, name, records, args)
        return len(records)

    def _upsert_locked(self, tenant: str, name: str, records: list[Record], args: tuple) -> None:
        """The upsert holding the head's lock from its first statement: caught up to the
        position before its own, checked there, its items written with ON CONFLICT (the
        ids are as they are at that position), committed here after PostgreSQL."""
        rep = self.replica
        with rep.locked():
            rep.check()
            with rep.store.write() as (c, pos):
                if rep.applied != pos - 1:
                    rep.catch_up(pos - 1)
                staged = self.local.stage_upsert(tenant, name, records)
                op = {"op": "upsert", "tenant": tenant, "name": name, "kind": self.kind.value,
                      "dim": self.local.describe(tenant, name).dim, "count": len(records)}
                c.execute(sql.UPSERT_ITEMS, args)
                rep.store.append(c, op, b"", pos)
                rep.writing = pos
                self._commit_both(staged, pos, lambda: rep.store.commit(c))
            rep.advance(pos)

    def _commit_both(self, staged: Any, pos: int, commit: Callable[[], None]) -> None:
        """PostgreSQL's COMMIT while the items are written here in an open SQLite
        transaction, which commits only after PostgreSQL's did."""
        rep = self.replica
        committed = False
        try:
            with staged.written():
                commit()
                committed = True
        except Exception as exc:
            if not committed:
                rep.writing = 0  # the position is given to the next write
                raise
            # committed, so acknowledged; this cache reloads
            rep.broken = f"upsert at position {pos} was not applied here: {exc}"
            log.exception("applying position %d here failed", pos)

    def _upsert_ahead(self, tenant: str, name: str, records: list[Record], op: dict[str, Any],
                      args: tuple) -> int:
        """One try, under the replica's lock, returning the position. The transaction's
        start and one statement (`_AHEAD`: the head's bump guarded by the position this
        server expects, the items, the NOTIFY, the log entry) go out in one pipeline,
        PostgreSQL running them while the items are checked here; then COMMIT goes out
        while the items are written here in an open SQLite transaction, which commits once
        PostgreSQL's did and rolls back when it did not. Another server's write first
        leaves the guard without a row (or the plain INSERT with a duplicate key): sql.Behind."""
        rep = self.replica
        expect = rep.applied + 1
        ids = [r.id for r in records]
        new = len(set(ids)) == len(ids) and not self.local.live_among(tenant, name, ids)
        with rep.store.write_ahead() as (c, pipe):
            try:
                with sql.outcome():  # (a pipelined statement may raise an earlier one's error)
                    cur = c.execute(sql.AHEAD_NEW if new else sql.AHEAD_ANY,
                                    (expect - 1, *args, Jsonb(op)))
            except InvalidArgument:  # PostgreSQL refused them
                sql.drain(pipe)
                self.local.stage_upsert(tenant, name, records)  # this check says why, if it can
                raise
            try:
                staged = self.local.stage_upsert(tenant, name, records)
            except (InvalidArgument, NotFound) as exc:
                try:
                    with sql.outcome():
                        pipe.sync()
                except InvalidArgument:  # PostgreSQL refused them too: this check says why
                    sql.drain(pipe)
                    raise exc from None
                if cur.fetchone() is None:  # behind: checked against an old state
                    raise sql.Behind from exc
                raise
            rep.writing = expect  # its NOTIFY is no news to the follower

            def commit() -> None:
                with sql.outcome(rep.store):
                    c.execute("COMMIT")
                    pipe.sync()
                if cur.fetchone() is None:  # another server's write first: nothing written
                    raise sql.Behind

            self._commit_both(staged, expect, commit)
        return expect

    def _encoded(self, tenant: str, name: str, records: list[Record]) -> tuple:
        try:
            return (tenant, self.kind.value, name, json.dumps(codec.encode_items(records)),
                    codec.item_vectors(records))
        except Exception:
            self.local.stage_upsert(tenant, name, records)  # names what is wrong with them
            raise

    def delete(
        self, tenant: str, name: str, *, ids: Sequence[str] | None = None,
        filter: Filter | None = None,
    ) -> int:
        if (ids is None) == (filter is None):
            raise InvalidArgument("pass either ids or a filter to delete")
        if filter is not None and filter.is_empty():
            raise InvalidArgument(
                "an empty filter would delete everything; delete the collection instead"
            )
        wanted = check_ids(ids) if ids is not None else None
        op: dict[str, Any] = {"op": "delete", "tenant": tenant, "name": name}

        def stage(c: Any, pos: int) -> None:
            if wanted is not None:
                live = sorted({r.id for r in self.local.get(tenant, name, wanted)})
            else:
                live = self.local.ids_matching(tenant, name, filter)
            if not live:
                raise _NothingToLog
            op["ids"] = live
            c.execute(
                "DELETE FROM rp_items WHERE tenant = %s AND kind = %s AND coll = %s "
                "AND id = ANY(%s)",
                (tenant, self.kind.value, name, live),
            )

        self._write(op, stage)
        return len(op.get("ids", ()))

    # ------------------------------------------------------------------ generations

    def rebuild(
        self, tenant: str, name: str, *, index_type: IndexType | None = None,
        params: IndexParams | None = None, reembed: Callable | None = None,
        embedder: str | None = None, min_recall: float = 0.95,
        progress: Callable | None = None,
    ) -> CollectionInfo:
        """Built here (recall checked here), then logged: the other servers build the
        same generation from the same rows when they reach it. One rebuild of a collection
        at a time in the cluster (an advisory lock)."""
        with self.replica.store.lease(f"rebuild/{tenant}/{self.kind.value}/{name}") as got:
            if not got:
                raise FailedPrecondition(
                    f"a rebuild of {name!r} is running on another server; wait for it"
                )
            if reembed is not None or embedder is not None:
                self._rebuild_reembed(tenant, name, index_type, params, reembed, embedder,
                                      min_recall, progress)
                return self.local.describe(tenant, name)
            info = self.local.rebuild(
                tenant, name, index_type=index_type, params=params, min_recall=min_recall,
                progress=progress,
            )
            config = {"index_type": info.index_type.value,
                      "params": codec.params_to_json(params or IndexParams())}
            self._write(
                {"op": "rebuild", "tenant": tenant, "name": name, "min_recall": 0.0, **config},
                lambda c, pos: self._set_config(c, tenant, name, config),
                own=lambda: None,
            )
        return self.local.describe(tenant, name)

    def _rebuild_reembed(
        self, tenant: str, name: str, index_type: IndexType | None,
        params: IndexParams | None, reembed: Callable | None, embedder: str | None,
        min_recall: float, progress: Callable | None,
    ) -> None:
        """A re-embedding rebuild runs inside its write: other writes wait within their
        budget, then are refused with retry-after (searches go on), so every server
        re-embeds exactly the rows of one position."""
        recording = reembed_mod.Recording(reembed) if reembed is not None else None
        op: dict[str, Any] = {"op": "rebuild", "tenant": tenant, "name": name,
                              "min_recall": 0.0, "reembed": recording is not None}

        def stage(c: Any, pos: int) -> None:
            info = self.local.rebuild(
                tenant, name, index_type=index_type, params=params, reembed=recording,
                embedder=embedder, min_recall=min_recall, progress=progress,
            )
            config = {"index_type": info.index_type.value, "embedder": info.embedder,
                      "params": codec.params_to_json(params or IndexParams()),
                      "dim": info.dim, "reembedded_generation": info.generation}
            op.update(index_type=config["index_type"], params=config["params"],
                      embedder=info.embedder)
            if recording is not None:
                self.replica.store.put_embeddings(c, info.embedder, recording.vectors)
                reembed_mod.revector_items(c, (tenant, self.kind.value, name),
                                           recording.vectors, info.embedder)
            self._set_config(c, tenant, name, config)

        self._write(op, stage, own=lambda: None)

    def rollback(self, tenant: str, name: str) -> CollectionInfo:
        """Rolled back here inside the write's transaction (a refusal rolls it back), then
        logged; a server without the previous generation (its cache was loaded from the
        tables since) keeps its current one and says so in its log."""
        def stage(c: Any, pos: int) -> None:
            (config,) = c.execute(
                "SELECT config FROM rp_collections WHERE tenant = %s AND kind = %s AND name = %s",
                (tenant, self.kind.value, name),
            ).fetchone() or (None,)
            info = self.local.describe(tenant, name)
            if config and config.get("reembedded_generation") == info.generation:
                raise FailedPrecondition(
                    f"{name!r} was re-embedded by its last rebuild: with a PostgreSQL store "
                    "that cannot be rolled back; rebuild it again with the previous embedder"
                )
            self.local.rollback(tenant, name)

        self._write({"op": "rollback", "tenant": tenant, "name": name}, stage, own=lambda: None)
        return self.local.describe(tenant, name)

    def snapshot(self, dest_dir: Any, also: Any = None) -> int:
        """A consistent copy of this server's cache at the position it has applied: an
        embedded store (serve it with store=sqlite, or copy it elsewhere). The truth stays
        in PostgreSQL: back that up there (pg_dump, a replica, point-in-time recovery)."""
        with self.replica.lock:  # nothing is applied meanwhile: one position throughout
            return self.replica.engine.snapshot(dest_dir, also)
