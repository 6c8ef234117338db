"""What every part of the engine shares: the data directory, its lock, the SQLite
connections and the registry of open collections.

One writer connection guarded by `db_lock`; readers use one connection per thread (WAL
lets them read while the writer commits).
"""

from __future__ import annotations

import copy
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ragplane.core.errors import FailedPrecondition, NotFound, Unavailable
from ragplane.core.sqlite import connect, transaction
from ragplane.core.storage import storage_errors
from ragplane.index.gpu import GpuCopies
from ragplane.index.state import Coll
from ragplane.index.store import DB_NAME
from ragplane.index.types import Kind
from ragplane.index.validate import check_name, is_name


@contextmanager
def data_dir_lock(path: Path, busy: str) -> Iterator[IO[str]]:
    """Hold the data directory's LOCK file exclusively; FailedPrecondition(`busy`) if taken."""
    lock = open(path / "LOCK", "a+")  # noqa: SIM115 - released below
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise FailedPrecondition(busy) from None
    try:
        yield lock
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


class Context:
    """Connections and collections of one open data directory. Thread-safe."""

    def __init__(
        self, data_dir: str | os.PathLike[str], checkpoint_every: int, gpu: GpuCopies | None = None,
        durable: bool = True,
    ) -> None:
        self.dir = Path(data_dir)
        self.kind = Kind.COLLECTION  # the kind of collection get/live/find/register see
        self.gpu = gpu  # unfiltered flat searches run on GPU copies when set
        self.idx_dir = self.dir / "indexes"
        self.checkpoint_every = max(1, int(checkpoint_every))
        self.db_path = self.dir / DB_NAME
        self.db_lock = threading.Lock()
        self._closed = threading.Event()  # an Event, so views of other kinds share it
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._local = threading.local()
        self.reg_lock = threading.Lock()
        self._colls: dict[tuple[str, str, str], Coll] = {}  # (tenant, kind, name)
        self.writer = connect(self.db_path, durable)

    def of_kind(self, kind: Kind) -> Context:
        """A view of the same store that sees the collections of `kind`."""
        view = copy.copy(self)
        view.kind = Kind(kind)
        return view

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def reader(self) -> sqlite3.Connection:
        """This thread's read connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            self.check_open()
            conn = connect(self.db_path)
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the writer connection; committed when the block ends.
        A full or read-only data directory raises StorageFull / StorageReadOnly, the
        transaction rolled back and the connection ready for the next write."""
        with self.db_lock:
            self.check_open()
            with storage_errors(self.dir), transaction(self.writer) as conn:
                yield conn

    def check_open(self) -> None:
        if self.closed:
            raise Unavailable("the index engine is closed")

    def find(self, tenant: str, name: str) -> Coll | None:
        """The open collection of this kind, or None (also when it is being dropped)."""
        coll = self._colls.get((tenant, self.kind, name))
        return None if coll is None or coll.dropped else coll

    def register(self, coll: Coll) -> None:
        self._colls[(coll.tenant, coll.purpose, coll.name)] = coll

    def unregister(self, coll: Coll) -> None:
        del self._colls[(coll.tenant, coll.purpose, coll.name)]

    def all(self) -> list[Coll]:
        """Every open collection of every kind (checkpoints, snapshots, close)."""
        return list(self._colls.values())

    def get(self, tenant: str, name: str) -> Coll:
        self.check_open()
        coll = self.find(tenant, name)
        if coll is None:
            if not is_name(name):
                check_name(name)
            raise NotFound(f"collection {name!r} does not exist; create it first or check the name")
        return coll

    def live(self, tenant: str | None = None) -> list[Coll]:
        """Open collections (of `tenant`, or of everyone), sorted by (tenant, name)."""
        colls = [
            c
            for (t, k, _), c in list(self._colls.items())
            if not c.dropped and k == self.kind and (tenant is None or t == tenant)
        ]
        return sorted(colls, key=lambda c: (c.tenant, c.name))

    def close(self) -> None:
        with self.db_lock:
            self._closed.set()
            self.writer.close()
        with self._conns_lock:
            for c in self._conns:
                c.close()
            self._conns.clear()
