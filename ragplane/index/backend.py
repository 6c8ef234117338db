"""The store's seam: what the server asks of a store (`Store`), of the follower that keeps a
shared store's cache at the log's head (`Follower`), and the one place that picks a store
(`open_store`), once, at start.

Two stores implement `Store`: the embedded one (`ragplane.index.engine.Engine`: SQLite +
FAISS in the data directory) and the shared one (`ragplane.index.pg.engine.PgEngine`:
PostgreSQL, this server's cache an embedded Engine). The layers above hold a `Backend`
and never ask which store it is; tests/unit/index/test_backend.py checks that both
implement every method, and `make lint` type-checks them against it (mypy, strict)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ragplane.core.serverdb import ServerDb, SqliteServerDb, Tables
from ragplane.index.engine import Engine
from ragplane.index.progress import RebuildProgress
from ragplane.index.types import (
    Chunking,
    CollectionInfo,
    Filter,
    Fusion,
    IndexParams,
    IndexType,
    Kind,
    Lease,
    Metric,
    Peer,
    Record,
    SearchKnobs,
    SearchResult,
)


class Store(Protocol):
    """Durable collections: the operations every store has, with the embedded store's
    arguments, errors and results (`Engine`'s docstrings say what each does). A write
    returns once it is durable in the store."""

    def of_kind(self, kind: Kind) -> Store: ...

    def run_once(self, name: str) -> AbstractContextManager[bool]: ...

    def close(self) -> None: ...

    # collections
    def create_collection(
        self, tenant: str, name: str, *, dim: int, metric: Metric, index_type: IndexType,
        embedder: str, params: IndexParams = ..., lexical_index: bool = ...,
        chunking: Chunking = ...,
    ) -> CollectionInfo: ...

    def delete_collection(self, tenant: str, name: str) -> None: ...

    def list_collections(self, tenant: str) -> list[CollectionInfo]: ...

    def list_all_collections(self) -> list[CollectionInfo]: ...

    def describe(self, tenant: str, name: str) -> CollectionInfo: ...

    def scan_size(self, tenant: str, name: str) -> int: ...

    def set_embedder(self, tenant: str, name: str, embedder: str) -> None: ...

    # items
    def upsert(self, tenant: str, name: str, records: Sequence[Record]) -> int: ...

    def delete(self, tenant: str, name: str, *, ids: Sequence[str] | None = ...,
               filter: Filter | None = ...) -> int: ...

    def get(self, tenant: str, name: str, ids: Sequence[str], *,
            include_vectors: bool = ...) -> list[Record]: ...

    def live_among(self, tenant: str, name: str, ids: Sequence[str]) -> set[str]: ...

    def iter_records(self, tenant: str, name: str,
                     batch: int = ...) -> Iterator[list[Record]]: ...

    def page(self, tenant: str, name: str, *, order_by: str,
             after: tuple[Any, str] | None = ..., limit: int,
             filter: Filter | None = ...) -> list[Record]: ...

    def ids_matching(self, tenant: str, name: str, filter: Filter) -> list[str]: ...

    def count_matching(self, tenant: str, name: str, filter: Filter | None) -> int: ...

    # searches
    def search(self, tenant: str, name: str, queries: np.ndarray, top_k: int, *,
               filter: Filter | None = ..., include_text: bool = ...,
               include_metadata: bool = ..., chunks_per_hit: int = ...,
               knobs: SearchKnobs | None = ...) -> list[SearchResult]: ...

    def search_lexical(self, tenant: str, name: str, text: str, top_k: int, *,
                       filter: Filter | None = ..., include_text: bool = ...,
                       include_metadata: bool = ..., chunks_per_hit: int = ...) -> SearchResult: ...

    def search_hybrid(self, tenant: str, name: str, text: str, vector: np.ndarray,
                      top_k: int, *, fusion: Fusion = ..., filter: Filter | None = ...,
                      include_text: bool = ..., include_metadata: bool = ...,
                      chunks_per_hit: int = ...) -> SearchResult: ...

    # generations
    def rebuild(self, tenant: str, name: str, *, index_type: IndexType | None = ...,
                params: IndexParams | None = ...,
                reembed: Callable[[list[str]], np.ndarray] | None = ...,
                embedder: str | None = ..., min_recall: float = ...,
                progress: Callable[[RebuildProgress], None] | None = ...) -> CollectionInfo: ...

    def rollback(self, tenant: str, name: str) -> CollectionInfo: ...

    def compact(self, tenant: str, name: str | None = ...) -> int: ...

    def snapshot(self, dest_dir: str | os.PathLike[str],
                 also: Callable[[Path], int] | None = ...) -> int: ...


class Follower(Protocol):
    """This server's place in a store shared by many: the change-log position its cache
    has applied, and whether it can answer (`ragplane.index.pg.follower.LogFollower`)."""

    @property
    def store_id(self) -> str: ...  # the store's id: consistency tokens start with it

    @property
    def applied(self) -> int: ...

    @property
    def head_seen(self) -> int: ...

    @property
    def ready(self) -> bool: ...  # caught up since start

    @property
    def broken(self) -> str | None: ...  # why the cache is being reloaded

    on_lag: Callable[[float], None] | None  # told each applied change's lag (seconds)

    def check(self) -> None: ...  # Unavailable unless it can answer now

    def wait_for(self, pos: int, timeout: float) -> None: ...  # Unavailable after timeout

    def lag_seconds(self) -> float: ...

    def healthy(self) -> bool: ...

    def peers(self) -> tuple[list[Peer], list[Lease]]: ...  # servers connected, leases held


@dataclass(frozen=True)
class StoreConfig:
    """Which store and how to open it (from the server's settings)."""

    url: str  # "sqlite", or a postgresql:// URL
    data_dir: Path
    checkpoint_every: int = 50_000
    use_gpu: bool = False
    integrity_check: str = "quick"
    log_keep: int = 1_000_000  # a shared store's log: changes kept behind the head


@dataclass(frozen=True)
class Backend:
    """The store a server runs on, chosen once by `open_store`."""

    store: Store
    #: None: this server is its store's only one (nothing to follow, no tokens)
    follower: Follower | None
    #: where the data lives, for the start log and the console (no password)
    where: str
    #: the server's own tables (keys, the shadow's evidence) in the same store
    server_db: Callable[[Tables], ServerDb]

    def close(self) -> None:
        self.store.close()


def open_store(config: StoreConfig) -> Backend:
    """The embedded store in `data_dir`, or (a PostgreSQL URL) the shared one with this
    server's cache in `data_dir/cache`, migrated, caught up and followed."""

    def open_local(path: Path, durable: bool = True) -> Engine:
        return Engine(path, checkpoint_every=config.checkpoint_every, use_gpu=config.use_gpu,
                      integrity_check=config.integrity_check, durable=durable)

    data_dir = config.data_dir
    if config.url == "sqlite":
        return Backend(open_local(data_dir), None, str(data_dir),
                       lambda tables: SqliteServerDb(data_dir / tables.file, tables))
    from ragplane.index.pg import open_pg  # psycopg is imported only with this store
    from ragplane.index.pg.serverdb import PgServerDb

    engine = open_pg(config.url, data_dir / "cache", open_local, config.log_keep)
    pg = engine.follower.store
    return Backend(engine, engine.follower, f"{data_dir}/cache, store {pg.where}",
                   lambda tables: PgServerDb(pg, tables))
