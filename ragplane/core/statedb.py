"""One small SQL face over the two places a server keeps its own state (API keys, shadow
evidence and flips): a SQLite file of its data directory, or, with a PostgreSQL store, the
shared store's tables (`ragplane.index.pg.state.PgStateDb`), which every server of the
cluster reads and writes.

A statement is written once, in the SQL both speak (`?` placeholders, `INSERT ... ON
CONFLICT`, `RETURNING`), with `{name}` for each table; each side maps the names to its own
tables (the SQLite files keep their tables as they were) and `{for_update}` to the row lock
PostgreSQL needs for a read-modify-write (SQLite's `BEGIN IMMEDIATE` already serialises).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from ragplane.core.sqlite import connect, transaction
from ragplane.core.storage import storage_errors

#: runs one statement inside a write; returns its cursor (rowcount, fetchone)
Execute = Callable[..., Any]


class StateDb(Protocol):
    #: other servers write the same tables: what this one caches goes stale
    shared: bool

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...

    def write(self) -> AbstractContextManager[Execute]: ...

    def close(self) -> None: ...


class SqliteStateDb:
    """A SQLite file of the data directory, its tables created by `schema` if missing.
    Writes are serialised and wrapped in `storage_errors` (a full or read-only data
    directory is StorageFull / StorageReadOnly, not a bug)."""

    shared = False

    def __init__(self, path: Path, names: dict[str, str], schema: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(path)
        self._dir = path.parent
        self._names = {**names, "for_update": ""}
        self._db.executescript(schema)
        self._lock = threading.Lock()

    def sql(self, statement: str) -> str:
        return statement.format_map(self._names)

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._db.execute(self.sql(sql), params).fetchall()

    @contextmanager
    def write(self) -> Iterator[Execute]:
        def execute(sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
            return self._db.execute(self.sql(sql), params)

        with self._lock, storage_errors(self._dir), transaction(self._db):
            yield execute

    def close(self) -> None:
        self._db.close()
