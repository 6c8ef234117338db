"""SQLite connections with the durability settings every store of ours relies on."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit `BEGIN IMMEDIATE`),
    WAL journal and synchronous=FULL, so a committed write survives power loss."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
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
