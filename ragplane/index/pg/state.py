"""The server's own state (API keys, shadow evidence and flips) in the shared store's
tables: `ragplane.core.statedb.StateDb` over the PgStore's pool (no second pool).

Every call takes a pooled connection; PostgreSQL unreachable, or lost mid-write, is
Unavailable with retry-after (`PgStore.conn`), the write then rolled back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ragplane.core.statedb import Execute
from ragplane.index.pg.log import PgStore


class PgStateDb:
    shared = True

    def __init__(self, store: PgStore, names: dict[str, str]) -> None:
        self.store = store
        self._names = {**names, "for_update": "FOR UPDATE"}

    def sql(self, statement: str) -> str:
        # the statements hold no literal `?` or `%`: placeholders are all there is to map
        return statement.format_map(self._names).replace("?", "%s")

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self.store.conn() as c:
            return c.execute(self.sql(sql), params).fetchall()

    @contextmanager
    def write(self) -> Iterator[Execute]:
        with self.store.conn() as c, c.transaction():
            yield lambda sql, params=(): c.execute(self.sql(sql), params)

    def close(self) -> None:
        """Nothing to close: the pool is the store's, closed with the engine."""
