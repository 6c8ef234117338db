"""The server's own database (API keys, shadow evidence and flips) in the shared store's
tables: `ragplane.core.serverdb.ServerDb` over the PgStore's pool (no second pool).

Every call takes a pooled connection; PostgreSQL unreachable, or lost mid-write, is
Unavailable with retry-after (`PgStore.conn`), the write then rolled back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ragplane.core.serverdb import Execute, Tables
from ragplane.index.pg.log import PgStore
from ragplane.index.pg.schema import SERVER_TABLES


class PgServerDb:
    """`tables`' names mapped to this store's tables (`schema.SERVER_TABLES`, version 2):
    a name the schema does not have is a KeyError at open."""

    shared = True

    def __init__(self, store: PgStore, tables: Tables) -> None:
        self.store = store
        self._names = {**{n: SERVER_TABLES[n] for n in tables.names}, "for_update": "FOR UPDATE"}

    def sql(self, statement: str) -> str:
        # the statements hold no literal `?` or `%`: placeholders are all there is to map
        return statement.format_map(self._names).replace("?", "%s")

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.store.conn() as c:
            return c.execute(self.sql(sql), params).fetchall()

    @contextmanager
    def write(self) -> Iterator[Execute]:
        with self.store.conn() as c, c.transaction():
            yield lambda sql, params=(): c.execute(self.sql(sql), params)

    def close(self) -> None:
        """Nothing to close: the pool is the store's, closed with the engine."""
