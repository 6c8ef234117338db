"""The shared store in PostgreSQL: a pool of connections, the commit-ordered change log
and the current state it leads to.

A write is one transaction: bump `rp_head` (its row lock orders writers until commit),
change `rp_items` / `rp_collections`, append the operation to `rp_changes` at that
position, NOTIFY the other servers. Its position is the consistency token of the reply.

Every PostgreSQL error becomes a domain error by its class (`failures`): unreachable, a
restart, a conflict are Unavailable with retry-after; a connection lost while committing
is Unavailable saying the outcome is unknown. The waits of a call (for a pooled
connection, for the head's lock) end within its `budget`, so a failed call answers in
under a second. Connections use no server-side prepared statements (psycopg's
`prepare_threshold=None`): a pipeline that an error aborts skips the statements queued
after it, preparations included, and a connection that believed them prepared would
answer "prepared statement does not exist" ever after; a round trip per execution is
what an unprepared statement costs here, not a parse of note. A connection that saw a
lost line, a protocol or pipeline error is discarded, never lent again."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from psycopg.types.json import Jsonb

from ragplane.core.errors import Unavailable
from ragplane.index.pg import changes, codec, failures, peers, schema
from ragplane.index.pg.changes import Op
from ragplane.index.types import Lease, Peer, Record

log = logging.getLogger(__name__)

CHANNEL = "rp_changes"
RETRY_AFTER = failures.RETRY_AFTER
CALL_WAIT = 0.5  # seconds a call may wait, all waits together: it answers within 1 s on a
# loaded machine too (0.7 measured 1.02 s once at load 11 on 2 cores)
MIN_WAIT = 0.05

_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("rp_pg_deadline", default=0.0)


@contextlib.contextmanager
def budget(seconds: float = CALL_WAIT) -> Iterator[None]:
    """The waits inside (a pooled connection, the follower's lock, PostgreSQL's row locks)
    end by `seconds` from now, each given at least MIN_WAIT; a budget already running
    (an outer call's) is kept. Work itself is not cut short: only waiting is."""
    if _deadline.get():
        yield
        return
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def wait_left(default: float | None) -> float | None:
    """How long the next wait may last: the budget's rest (at least MIN_WAIT), at most
    `default`; `default` when no budget runs (None: as long as it takes)."""
    deadline = _deadline.get()
    if not deadline:
        return default
    left = max(MIN_WAIT, deadline - time.monotonic())
    return left if default is None else min(default, left)


@dataclass(frozen=True)
class Change:
    pos: int
    op: Op
    at: float = 0.0  # when it was written (unix seconds, PostgreSQL's clock)


def text_sha(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the configured PostgreSQL"
    host = info.get("host", "localhost")
    user, port, db = info.get("user", ""), info.get("port", 5432), info.get("dbname", "")
    return f"postgresql://{user}@{host}:{port}/{db}"


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """PostgreSQL's and the pool's errors as domain errors (`failures.translate`)."""
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
        mapped = failures.translate(exc, where)
        if mapped is None:
            raise
        raise mapped from exc


class PgStore:
    """The connection pool and every statement of the shared store."""

    def __init__(self, url: str, *, max_size: int = 8, timeout: float = 1.0) -> None:
        self.url = url
        self.where = redact(url)
        self._timeout = timeout
        self.pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout)),
                    "prepare_threshold": None,  # see the module's docstring
                    "application_name": peers.APP_NAME},  # the servers seen: `peers`
            open=False,
            reconnect_timeout=0,  # keep trying: PostgreSQL may come back at any time
            check=self._check,
            reset=self._reset,
        )
        self._answered: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = (
            weakref.WeakKeyDictionary()
        )
        self._held = threading.local()
        self.pool.open(wait=False)
        self.store_id = ""

    def _check(self, c: psycopg.Connection) -> None:
        """A connection idle for over a second is checked (one round trip) before it is
        lent: PostgreSQL may have restarted meanwhile. One that answered a moment ago is
        not, so that a busy server does not pay a round trip per write."""
        if time.monotonic() - self._answered.get(c, 0.0) > 1.0:
            psycopg_pool.ConnectionPool.check_connection(c)

    @staticmethod
    def _reset(c: psycopg.Connection) -> None:
        """On its return to the pool (rolled back already): one left in pipeline mode is
        out of step with the server; raising here makes the pool discard it."""
        if c.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF:
            raise psycopg.InterfaceError("returned in pipeline mode")

    def close(self) -> None:
        self.pool.close()

    @contextlib.contextmanager
    def conn(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        """A pooled connection, waited for up to `timeout` (the pool's) within the call's
        budget; inside a write on this thread, the write's own (a catch-up reads in its
        transaction: one connection per write, never two). Errors become domain errors;
        the connection is discarded after one that leaves it unfit (`failures.reusable`)."""
        held = getattr(self._held, "c", None)
        if held is not None and held.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF:
            with translated(self.where), self._discarding(held):
                yield held
            return
        wait = wait_left(self._timeout if timeout is None else timeout)
        with translated(self.where), self.pool.connection(timeout=wait) as c:
            with self._discarding(c):
                yield c
            self._answered[c] = time.monotonic()

    @staticmethod
    @contextlib.contextmanager
    def _discarding(c: psycopg.Connection) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if not failures.reusable(exc):
                log.debug("discarding a connection after %r", exc)
                with contextlib.suppress(Exception):
                    c.close()  # the pool sees it closed and replaces it
            raise

    @contextlib.contextmanager
    def _holding(self, c: psycopg.Connection) -> Iterator[None]:
        """`conn()` on this thread lends `c` meanwhile."""
        self._held.c = c
        try:
            yield
        finally:
            self._held.c = None

    def migrate(self) -> str:
        with self.conn() as c:
            self.store_id = schema.migrate(c)
        return self.store_id

    # ------------------------------------------------------------------ writes

    @contextlib.contextmanager
    def write(self) -> Iterator[tuple[psycopg.Connection, int]]:
        """A write transaction at the next position: yields (connection, position); the
        caller changes the state tables and calls `append`. Commits on exit, unless the
        caller did (`commit`)."""
        with self.conn() as c, self._holding(c), self._transaction(c):
            cur = c.execute(f"BEGIN; {_lock_timeout()}; UPDATE rp_head SET pos = pos + 1 "
                            "RETURNING pos")
            cur.nextset()  # one round trip for the three; the position is the last result
            cur.nextset()
            yield c, int(_first(cur.fetchone()))

    @contextlib.contextmanager
    def write_ahead(self) -> Iterator[tuple[psycopg.Connection, psycopg.Pipeline]]:
        """A write whose statements go out before its position is known: BEGIN (with the
        call's lock timeout) and what the caller executes, which bumps the head itself,
        travel in one pipeline, PostgreSQL running them while the caller goes on. Commits
        on exit unless the caller did."""
        with self.conn() as c, self._holding(c), self._transaction(c), c.pipeline() as pipe:
            c.execute("BEGIN")
            c.execute(_lock_timeout())
            yield c, pipe

    @contextlib.contextmanager
    def _transaction(self, c: psycopg.Connection) -> Iterator[None]:
        """Rolled back when the block raises; else committed unless the block did."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                c.execute("ROLLBACK")
            raise
        if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self.commit(c)

    def commit(self, c: psycopg.Connection) -> None:
        """COMMIT; a refusal of the server (a statement's error: nothing committed) is
        raised as it is, a line lost meanwhile leaves the outcome unknown."""
        try:
            c.execute("COMMIT")
        except psycopg.Error as exc:
            if failures.refused(exc):
                raise
            raise self.lost_at_commit() from exc

    def lost_at_commit(self) -> Unavailable:
        return Unavailable(
            f"PostgreSQL ({self.where}) was lost while committing: the outcome is unknown; "
            "retry: upserts by id are idempotent",
            RETRY_AFTER,
        )

    @staticmethod
    def append(c: psycopg.Connection[Any], op: Op, pos: int) -> None:
        """Log `op` at the write's position and NOTIFY it."""
        c.execute(
            "WITH n AS (SELECT pg_notify(%s, %s)) INSERT INTO rp_changes "
            "(pos, op, at) SELECT %s, %s, clock_timestamp() FROM n",
            (CHANNEL, str(pos), pos, Jsonb(op.encode())),
        )

    # ------------------------------------------------------------------ reads

    def head(self) -> int:
        with self.conn() as c:
            return int(_first(c.execute("SELECT pos FROM rp_head").fetchone()))

    def oldest(self) -> int:
        """The first position the log still keeps (head + 1 when it is empty)."""
        with self.conn() as c:
            row = c.execute(
                "SELECT COALESCE((SELECT MIN(pos) FROM rp_changes),"
                " (SELECT pos + 1 FROM rp_head))"
            ).fetchone()
            return int(_first(row))

    def changes_after(self, pos: int, limit: int = 1000) -> list[Change]:
        with self.conn() as c:
            rows = c.execute(
                "SELECT pos, op, extract(epoch FROM at)::float8 FROM rp_changes "
                "WHERE pos > %s ORDER BY pos LIMIT %s",
                (pos, limit),
            ).fetchall()
        return [Change(int(p), changes.decode(op), float(at)) for p, op, at in rows]

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[tuple[psycopg.Connection, int]]:
        """A repeatable-read view of the state tables and the head it reflects."""
        with self.conn() as c:
            c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with c.transaction():
                    yield c, int(_first(c.execute("SELECT pos FROM rp_head").fetchone()))
            finally:
                c.isolation_level = None

    def prune(self, keep: int) -> int:
        """Drop log entries more than `keep` positions behind the head."""
        with self.conn() as c:
            cur = c.execute(
                "DELETE FROM rp_changes WHERE pos <= (SELECT pos FROM rp_head) - %s", (keep,)
            )
            return cur.rowcount

    @contextlib.contextmanager
    def lease(self, name: str) -> Iterator[bool]:
        """Work that must run once in the cluster: yields whether this server got `name`'s
        advisory lock (held on one connection until the block ends, or until this server
        dies: PostgreSQL frees it with the session)."""
        with self.conn() as c:
            got = bool(_first(c.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (name,)
            ).fetchone()))
            try:
                yield got
            finally:
                if got:
                    with contextlib.suppress(psycopg.Error):
                        c.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (name,))

    def peers(self) -> tuple[list[Peer], list[Lease]]:
        """The servers connected to the store now, and the leases they hold (`peers`)."""
        with self.conn() as c:
            return peers.servers(c), peers.leases(c)

    def items(self, tenant: str, kind: str, coll: str, pos: int, dim: int) -> list[Record]:
        """The items the change at `pos` wrote that no later change replaced or deleted, as
        Records (a later change brings the newer versions itself: applying converges)."""
        with self.conn() as c:
            rows = c.execute(
                "SELECT body, vectors FROM rp_items WHERE tenant = %s AND kind = %s AND "
                "coll = %s AND pos = %s",
                (tenant, kind, coll, pos),
                binary=True,
            ).fetchall()
        return codec.decode_records([b for b, _ in rows], b"".join(bytes(v) for _, v in rows), dim)

    @staticmethod
    def put_embeddings(c: psycopg.Connection, embedder: str, vectors: dict[str, bytes]) -> None:
        with c.cursor() as cur:
            cur.executemany(
                "INSERT INTO rp_embeddings (embedder, sha, vector) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                [(embedder, text_sha(t), v) for t, v in vectors.items()],
            )

    def embeddings(self, embedder: str, texts: list[str]) -> list[bytes | None]:
        """The vectors a re-embedding rebuild stored for `texts` (None where missing)."""
        shas = [text_sha(t) for t in texts]
        with self.conn() as c:
            rows = c.execute(
                "SELECT sha, vector FROM rp_embeddings WHERE embedder = %s AND sha = ANY(%s)",
                (embedder, shas),
            ).fetchall()
        found = {bytes(s): bytes(v) for s, v in rows}
        return [found.get(s) for s in shas]

    def listener(self) -> psycopg.Connection:
        """A dedicated connection LISTENing for new positions."""
        with translated(self.where):
            c = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self._timeout))
            )
        c.execute(f"LISTEN {CHANNEL}")
        return c


def _first(row: tuple[Any, ...] | None) -> Any:
    """The first value of a row a query always returns (one of rp_head, an aggregate)."""
    assert row is not None
    return row[0]


def _lock_timeout() -> str:
    """The write's wait for a row lock (the head's) within the call's budget; without a
    budget (a rebuild, a migration) as long as it takes."""
    wait = wait_left(None)
    return "SET LOCAL lock_timeout = 0" if wait is None else (
        f"SET LOCAL lock_timeout = {max(1, int(wait * 1000))}"
    )
