"""PostgreSQL as the shared truth: any number of servers, each with indexes derived from
its change log (ARCHITECTURE.md, "The cluster")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ragplane.index.engine import Engine


def open_shared(url: str, cache_dir: Path, open_local: Callable[..., Engine],
                log_keep: int = 1_000_000):  # -> SharedEngine (imported lazily: psycopg)
    """Migrate the schema, load or catch up this server's cache, follow the log."""
    from ragplane.index.pg.log import PgStore
    from ragplane.index.pg.replica import Replica
    from ragplane.index.pg.shared import SharedEngine

    store = PgStore(url)
    try:
        replica = Replica(store, cache_dir, open_local, log_keep=log_keep)
        replica.start()
    except BaseException:
        store.close()
        raise
    return SharedEngine(replica)
