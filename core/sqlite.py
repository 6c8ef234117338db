"""SQLite connections with the durability settings every store of ours relies on."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit `BEGIN IMMEDIATE`),
    WAL journal and synchronous=FULL, so a committed write survives power loss."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn
