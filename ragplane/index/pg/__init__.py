"""PostgreSQL as the shared truth: any number of servers, each with indexes derived from
its change log (ARCHITECTURE.md, "Past one server"). Chosen by
`ragplane.index.backend.open_store`, the one module outside this package that imports it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ragplane.index.engine import Engine

if TYPE_CHECKING:  # psycopg is imported only when this store is opened
    from ragplane.index.pg.engine import PgEngine


def open_pg(url: str, cache_dir: Path, open_local: Callable[..., Engine],
            log_keep: int = 1_000_000) -> PgEngine:
    """Migrate the schema, load or catch up this server's cache, follow the log."""
    from ragplane.index.pg.engine import PgEngine
    from ragplane.index.pg.follower import LogFollower
    from ragplane.index.pg.log import PgStore

    store = PgStore(url)
    try:
        follower = LogFollower(store, cache_dir, open_local, log_keep=log_keep)
        follower.start()
    except BaseException:
        store.close()
        raise
    return PgEngine(follower)
