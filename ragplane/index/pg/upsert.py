"""An upsert on the shared store, one path in this module that drives this server's cache
and PostgreSQL in turn; nothing in the cache calls back into PostgreSQL.

    1. find the collection in the cache (`Engine.stage_upsert`) and which ids it holds
    2. send the statements, at the position this server expects       (PostgreSQL)
    3. check the items against the collection (`staged.check`)        (cache, meanwhile)
    4. write the rows in an open SQLite transaction (`staged.written`) (cache, meanwhile)
    5. COMMIT, inside that transaction                                (PostgreSQL)
    6. the cache commits and indexes the rows as the block ends; the position is applied

Steps 3 and 4 run while PostgreSQL runs the statements of step 2 (the overlap
BENCHMARKS.md section 15 measures), and the cache commits only after PostgreSQL did, so it
never holds a row PostgreSQL does not.

The statements of the first try (`_ahead`) go out in one pipeline before the position is
known: the head's bump guarded by the position this server expects, the items as one
`INSERT ... SELECT FROM unnest`, the NOTIFY, the log entry (`upsert_sql`). Ids the cache
does not have go in by a plain INSERT (no speculative insertion). Another server's write
first (the guard finds another head, or an id new here that it added) fails the
transaction: sql.Behind, nothing committed; so does a check of step 3 that failed against
a cache that turned out to be behind. The second try (`_locked`) holds the head's lock
from its first statement and catches the cache up to the position before its own, so its
check is exact: no other write can overtake it, two tries at most, and a client sees no
conflict. The items are written once, to rp_items at this change's position, where the
other servers read them."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ragplane.core.errors import InvalidArgument, NotFound
from ragplane.index.engine import Engine
from ragplane.index.pg import codec
from ragplane.index.pg import upsert_sql as sql
from ragplane.index.pg.changes import Upsert
from ragplane.index.pg.follower import LogFollower
from ragplane.index.pg.log import budget
from ragplane.index.types import Kind, Record
from ragplane.index.writes import StagedUpsert

log = logging.getLogger(__name__)


class PgUpsert:
    """One upsert of `records` into the collection (tenant, kind, name); `run` once."""

    def __init__(self, follower: LogFollower, kind: Kind, tenant: str, name: str,
                 records: list[Record]) -> None:
        self.follower = follower
        self.kind, self.tenant, self.name, self.records = kind, tenant, name, records
        self._args: tuple[Any, ...] | None = None
        self._unencodable: Exception | None = None

    def run(self) -> int:
        """Encoded once, before the follower's lock (held by one write at a time)."""
        try:
            self._args = (self.tenant, self.kind.value, self.name,
                          json.dumps(codec.encode_items(self.records)),
                          codec.item_vectors(self.records))
        except Exception as exc:  # the cache's check names what is wrong, if it can
            self._unencodable = exc
        fol = self.follower
        with budget(), fol.locked():
            fol.check()
            try:
                self._ahead()
            except sql.Behind:  # nothing committed: again, first in line
                self._locked()
        return len(self.records)

    def _ahead(self) -> None:
        """The first try: sent at the position this server expects, the items checked
        against the cache while PostgreSQL runs the statements."""
        fol = self.follower
        staged = self._found()
        if self._unencodable is not None:  # the check names what is wrong, if it can
            staged.check()
            raise self._unencodable
        pos = fol.applied + 1
        statement = sql.AHEAD_NEW if staged.all_new() else sql.AHEAD_ANY
        with fol.store.write_ahead() as (c, pipe):
            try:
                op = Jsonb(self._op(staged).encode())
                refused: InvalidArgument | None = None
                try:
                    with sql.outcome():  # (a pipelined statement may raise an earlier one's)
                        cur = c.execute(statement, (pos - 1, *self._encoded(), op))
                except InvalidArgument as exc:  # PostgreSQL refused them: the check first
                    refused = exc
                try:
                    staged.check()
                except (InvalidArgument, NotFound) as exc:
                    if refused is None and self._behind(pipe, cur):
                        raise sql.Behind from exc  # checked against a state gone since
                    raise
                if refused is not None:
                    raise refused

                def commit() -> None:
                    with sql.outcome(fol.store):
                        c.execute("COMMIT")
                        pipe.sync()
                    if cur.fetchone() is None:  # another server's write first: none written
                        raise sql.Behind

                self._write_here(staged, pos, commit)
            except BaseException:  # refused, not first, or the line lost: close the pipeline
                sql.drain(pipe)
                raise

    @staticmethod
    def _behind(pipe: psycopg.Pipeline, cur: psycopg.Cursor[Any]) -> bool:
        """Whether the statements sent found another server's write first (nothing
        written); False when PostgreSQL refused them too."""
        try:
            with sql.outcome():
                pipe.sync()
        except InvalidArgument:
            return False
        return cur.fetchone() is None

    def _locked(self) -> None:
        """The second try, holding the head's lock from its first statement: the cache is
        caught up to the position before this one, so its check is exact, and the items are
        written with ON CONFLICT (the ids are as they are at that position)."""
        fol = self.follower
        with fol.store.write() as (c, pos):
            if fol.applied != pos - 1:
                fol.catch_up(pos - 1)
            staged = self._cache().stage_upsert(self.tenant, self.name, self.records)
            staged.check()
            with sql.outcome():
                c.execute(sql.UPSERT_ITEMS, self._encoded())
            fol.store.append(c, self._op(staged), pos)
            self._write_here(staged, pos, lambda: fol.store.commit(c))

    def _write_here(self, staged: StagedUpsert, pos: int, commit: Callable[[], None]) -> None:
        """The cache's write, committed once PostgreSQL's `commit` returned; the position is
        applied here then. A failure after PostgreSQL's commit is acknowledged all the same:
        this cache reloads."""
        fol = self.follower
        committed = False
        try:
            with staged.written():
                fol.writing = pos  # its NOTIFY is no news to the follower
                commit()
                committed = True
        except Exception as exc:
            if not committed:
                fol.writing = 0  # the position is given to the next write
                raise
            fol.broken = f"upsert at position {pos} was not applied here: {exc}"
            log.exception("applying position %d here failed", pos)
        fol.advance(pos)

    def _cache(self) -> Engine:
        return self.follower.engine.of_kind(self.kind)

    def _found(self) -> StagedUpsert:
        """The upsert's collection as the cache has it. Not found: caught up with the log
        and looked for once more (made on another server a moment ago?)."""
        before = self.follower.applied
        try:
            return self._cache().stage_upsert(self.tenant, self.name, self.records)
        except NotFound:
            if self.follower.catch_up() == before:
                raise
        return self._cache().stage_upsert(self.tenant, self.name, self.records)

    def _encoded(self) -> tuple[Any, ...]:
        """The statements' arguments, or what made them fail to encode."""
        if self._unencodable is not None:
            raise self._unencodable
        assert self._args is not None
        return self._args

    def _op(self, staged: StagedUpsert) -> Upsert:
        return Upsert(self.tenant, self.kind, self.name, staged.dim, len(self.records))
