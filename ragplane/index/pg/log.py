"""The shared store in PostgreSQL: a pool of connections, the commit-ordered change log
and the current state it leads to.

A write is one transaction: bump `rp_head` (its row lock orders writers until commit),
change `rp_items` / `rp_collections`, append the operation to `rp_changes` at that
position, NOTIFY the other servers. Its position is the consistency token of the reply.

PostgreSQL unreachable becomes Unavailable (retry-after), within the pool's 1 s timeout; a
connection lost while committing becomes Unavailable saying the outcome is unknown."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from psycopg.types.json import Jsonb

from ragplane.core.errors import Unavailable
from ragplane.index.pg import schema

log = logging.getLogger(__name__)

CHANNEL = "rp_changes"
RETRY_AFTER = 1.0


@dataclass(frozen=True)
class Change:
    pos: int
    op: dict[str, Any]
    vectors: bytes
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
def unavailable(where: str, what: str = "") -> Iterator[None]:
    """PostgreSQL's connection failures as Unavailable with retry-after."""
    try:
        yield
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Unavailable(
            f"PostgreSQL ({where}) is unreachable{what}: {first}; retry", RETRY_AFTER
        ) from exc


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
            kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout))},
            open=False,
            reconnect_timeout=0,  # keep trying: PostgreSQL may come back at any time
            check=self._check,
        )
        self._answered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.pool.open(wait=False)
        self.store_id = ""

    def _check(self, c: psycopg.Connection) -> None:
        """A connection idle for over a second is checked (one round trip) before it is
        lent: PostgreSQL may have restarted meanwhile. One that answered a moment ago is
        not, so that a busy server does not pay a round trip per write."""
        if time.monotonic() - self._answered.get(c, 0.0) > 1.0:
            psycopg_pool.ConnectionPool.check_connection(c)

    def close(self) -> None:
        self.pool.close()

    @contextlib.contextmanager
    def conn(self) -> Iterator[psycopg.Connection]:
        with unavailable(self.where), self.pool.connection() as c:
            yield c
            self._answered[c] = time.monotonic()

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
        with self.conn() as c, self._transaction(c):
            cur = c.execute("BEGIN; UPDATE rp_head SET pos = pos + 1 RETURNING pos")
            cur.nextset()  # one round trip for both; the position is the second result
            (pos,) = cur.fetchone()
            yield c, int(pos)

    @contextlib.contextmanager
    def write_ahead(self) -> Iterator[tuple[psycopg.Connection, psycopg.Pipeline]]:
        """`write` whose statements go out before its position is known: BEGIN, the head's
        bump and what the caller executes travel in one pipeline, PostgreSQL running them
        while the caller goes on; statements name the position as rp_head's `pos` (as
        `append` does without one). Commits on exit unless the caller did."""
        with self.conn() as c, self._transaction(c), c.pipeline() as pipe:
            c.execute("BEGIN")
            c.execute("UPDATE rp_head SET pos = pos + 1")
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
            try:
                c.execute("COMMIT")
            except psycopg.OperationalError as exc:
                raise self.lost_at_commit() from exc

    def lost_at_commit(self) -> Unavailable:
        return Unavailable(
            f"PostgreSQL ({self.where}) was lost while committing: the outcome is unknown; "
            "retry: upserts by id are idempotent",
            RETRY_AFTER,
        )

    @staticmethod
    def append(c: psycopg.Connection, op: dict[str, Any], vectors: bytes = b"",
               pos: int | None = None) -> None:
        """Log `op` at the write's position (`pos`, or when it is not known yet, the head
        the write bumped)."""
        if pos is not None:
            c.execute(
                "WITH n AS (SELECT pg_notify(%s, %s)) INSERT INTO rp_changes "
                "(pos, op, vectors, at) SELECT %s, %s, %s, clock_timestamp() FROM n",
                (CHANNEL, str(pos), pos, Jsonb(op), vectors or None),
            )
            return
        # two statements: pg_notify of the head in the INSERT's CTE costs ~5 ms (measured)
        c.execute("SELECT pg_notify(%s, pos::text) FROM rp_head", (CHANNEL,))
        c.execute(
            "INSERT INTO rp_changes (pos, op, vectors, at) "
            "SELECT pos, %s, %s, clock_timestamp() FROM rp_head",
            (Jsonb(op), vectors or None),
        )

    # ------------------------------------------------------------------ reads

    def head(self) -> int:
        with self.conn() as c:
            return int(c.execute("SELECT pos FROM rp_head").fetchone()[0])

    def oldest(self) -> int:
        """The first position the log still keeps (head + 1 when it is empty)."""
        with self.conn() as c:
            row = c.execute(
                "SELECT COALESCE((SELECT MIN(pos) FROM rp_changes),"
                " (SELECT pos + 1 FROM rp_head))"
            ).fetchone()
            return int(row[0])

    def changes_after(self, pos: int, limit: int = 1000) -> list[Change]:
        with self.conn() as c:
            rows = c.execute(
                "SELECT pos, op, vectors, extract(epoch FROM at)::float8 FROM rp_changes "
                "WHERE pos > %s ORDER BY pos LIMIT %s",
                (pos, limit),
            ).fetchall()
        return [Change(int(p), op, bytes(v or b""), float(at)) for p, op, v, at in rows]

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[tuple[psycopg.Connection, int]]:
        """A repeatable-read view of the state tables and the head it reflects."""
        with self.conn() as c:
            c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with c.transaction():
                    (pos,) = c.execute("SELECT pos FROM rp_head").fetchone()
                    yield c, int(pos)
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
            got = bool(c.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (name,)
            ).fetchone()[0])
            try:
                yield got
            finally:
                if got:
                    with contextlib.suppress(psycopg.Error):
                        c.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (name,))

    def items(self, tenant: str, kind: str, coll: str, pos: int, dim: int) -> list:
        """The items the change at `pos` wrote that no later change replaced or deleted, as
        Records (a later change brings the newer versions itself: applying converges)."""
        from ragplane.index.pg.codec import decode_records

        with self.conn() as c:
            rows = c.execute(
                "SELECT body, vectors FROM rp_items WHERE tenant = %s AND kind = %s AND "
                "coll = %s AND pos = %s",
                (tenant, kind, coll, pos),
                binary=True,
            ).fetchall()
        return decode_records([b for b, _ in rows], b"".join(bytes(v) for _, v in rows), dim)

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
        with unavailable(self.where):
            c = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self._timeout))
            )
        c.execute(f"LISTEN {CHANNEL}")
        return c


