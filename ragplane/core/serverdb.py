"""The server's own database (API keys, the shadow's evidence and flips), apart from the
collections: one small SQL face over the two places it lives. A SQLite file of the data
directory, or, with a PostgreSQL store, that store's tables (`ragplane.index.pg.serverdb`),
which every server of the cluster reads and writes. The store the server runs on opens it
(`ragplane.index.backend.Backend.server_db`); the modules that keep state here name their
tables (`Tables`) and never ask which store they have.

A statement is written once, in the SQL both speak (`?` placeholders, `INSERT ... ON
CONFLICT`, `RETURNING`), with `{name}` for each table; each side maps the names to its own
tables (the SQLite files keep their tables as they were) and `{for_update}` to the row lock
PostgreSQL needs for a read-modify-write (SQLite's `BEGIN IMMEDIATE` already serialises).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ragplane.core.sqlite import connect, transaction
from ragplane.core.storage import storage_errors

#: runs one statement inside a write; returns its cursor (rowcount, fetchone)
Execute = Callable[..., Any]


@dataclass(frozen=True)
class Tables:
    """One module's tables: their names in its statements -> the SQLite tables of its own
    file in the data directory (`file`, created by `schema`; `added`: columns, by table
    name, that a file from before them lacks, added at open). A shared store maps the same
    names to its own tables."""

    file: str
    names: Mapping[str, str]
    schema: str
    added: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


class ServerDb(Protocol):
    #: other servers write the same tables: what this one caches goes stale
    shared: bool

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def write(self) -> AbstractContextManager[Execute]: ...

    def close(self) -> None: ...


class SqliteServerDb:
    """A SQLite file of the data directory, its tables created if missing. Writes are
    serialised and wrapped in `storage_errors` (a full or read-only data directory is
    StorageFull / StorageReadOnly, not a bug)."""

    shared = False

    def __init__(self, path: Path, tables: Tables) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(path)
        self._dir = path.parent
        self._names = {**tables.names, "for_update": ""}
        self._db.executescript(tables.schema)
        self._lock = threading.Lock()
        self._add_columns(tables.added)

    def sql(self, statement: str) -> str:
        return statement.format_map(self._names)

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(self.sql(sql), params).fetchall()

    @contextmanager
    def write(self) -> Iterator[Execute]:
        def execute(sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
            return self._db.execute(self.sql(sql), params)

        with self._lock, storage_errors(self._dir), transaction(self._db):
            yield execute

    def _add_columns(self, added: Mapping[str, Mapping[str, str]]) -> None:
        for table, columns in added.items():
            have = {row[1] for row in self.read(f"PRAGMA table_info({{{table}}})")}
            missing = [(c, decl) for c, decl in columns.items() if c not in have]
            if missing:
                with self.write() as execute:
                    for column, decl in missing:
                        execute(f"ALTER TABLE {{{table}}} ADD COLUMN {column} {decl}")

    def close(self) -> None:
        self._db.close()
