"""SQLite connections with the durability settings every store of ours relies on."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ragplane.core.errors import Corrupt

SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26


def connect(path: Path, durable: bool = True) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit `BEGIN IMMEDIATE`),
    WAL journal and synchronous=FULL, so a committed write survives power loss. Not
    `durable` (a cache whose truth is elsewhere): synchronous=OFF, a commit survives the
    process but maybe not the machine."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`BEGIN IMMEDIATE` ... `COMMIT`, rolled back when the block or the COMMIT fails.

    SQLite may already have rolled the transaction back itself (SQLITE_FULL does), so the
    ROLLBACK is issued only while one is open; a connection is never left inside a dead
    transaction that would refuse every later BEGIN."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def corrupt(path: Path, finding: str, data_dir: Path | None = None) -> Corrupt:
    """The error for a damaged store at `path` (a file of `data_dir`, its parent by default),
    with the way back."""
    return Corrupt(
        f"the store {str(path)!r} is damaged ({finding}); the server will not serve from it. "
        "Keep the file for diagnosis and restore the last snapshot: ragplane admin restore "
        f"<snapshot dir> --data-dir {str(data_dir or path.parent)!r} (README: Running in "
        "production)"
    )


def check_integrity(conn: sqlite3.Connection, path: Path, full: bool = False) -> None:
    """Raise Corrupt if SQLite finds `path` damaged. quick_check reads every page and checks
    the b-trees (O(size), seconds for gigabytes); integrity_check (`full`) also checks that
    every index matches its table."""
    pragma = "integrity_check" if full else "quick_check"
    try:
        rows = conn.execute(f"PRAGMA {pragma}(5)").fetchall()
    except sqlite3.DatabaseError as exc:
        raise corrupt(path, f"{pragma} failed: {exc}") from exc
    if [r[0] for r in rows] != ["ok"]:
        raise corrupt(path, f"{pragma}: " + "; ".join(str(r[0]) for r in rows))
