"""The durable vector engine: SQLite as the source of truth, FAISS per collection.

Concurrency model (the engine is called from many gRPC threads at once):

* One writer SQLite connection guarded by `_db_lock`; readers use one connection per
  thread (WAL lets them read while the writer commits).
* Per collection, `write_mutex` serialises writers (so sequence numbers reach FAISS in
  commit order) and the swap step of a rebuild; `rw` is a readers-writer lock: searches
  share it, FAISS adds and index swaps take it exclusively.
* `maint_lock` admits one rebuild / rollback / compaction per collection at a time.

Lock order: maint_lock -> write_mutex -> _db_lock -> rw.

Durability: a write returns after its SQLite transaction commits. FAISS indexes are
derived: checkpointed to ``indexes/<collection id>/`` and, on open, loaded and caught up
from rows newer than the checkpoint, or rebuilt from the store when no checkpoint loads.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index import faiss_index as fx
from index.filters import compile_filter
from index.rebuild import RebuildProgress, recall_at_k
from index.store import DB_NAME, connect, init_schema
from index.types import (
    CollectionInfo,
    Filter,
    Hit,
    IndexParams,
    IndexType,
    Metric,
    Record,
    SearchResult,
)
from server.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable

log = logging.getLogger(__name__)

MAX_TOP_K = 10_000
# FAISS GPU indexes answer at most this many neighbours per query.
_GPU_MAX_K = 2048


def faiss_gpu_available() -> bool:
    """Whether this FAISS build has GPU support (faiss-gpu, the [gpu] extra) and sees a GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


MAX_DIM = 65_536
MAX_ID_LEN = 1024
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
# A filtered search on an approximate index scans the matching vectors exactly when the
# filter leaves at most this many (or this fraction of) live items: cheap, and exact.
EXACT_SCAN_MAX = 4096
EXACT_SCAN_FRACTION = 0.02
_ADD_BATCH = 4096
_READ_BATCH = 4096
_REEMBED_BATCH = 256
# HNSW inserts are slow (~1 ms each); adding a large batch in chunks lets searches on the
# collection run between chunks instead of waiting for the whole batch.
_HNSW_ADD_CHUNK = 32
_FILTER_CACHE_SIZE = 64


def _mask_lookup(mask: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def allowed(ids: np.ndarray) -> np.ndarray:
        ok = ids < mask.size
        ok[ok] = mask[ids[ok]]
        return ok

    return allowed


class _RWLock:
    """Writer-preferring readers-writer lock (not re-entrant)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass(eq=False)
class _Coll:
    id: int
    tenant: str
    name: str
    dim: int
    metric: Metric
    index_type: IndexType  # requested
    embedder: str
    params: IndexParams  # requested
    generation: int
    created_at: float
    dir: Path
    kind: IndexType = IndexType.FLAT  # what the FAISS index is
    rparams: IndexParams = field(default_factory=IndexParams)  # resolved for `kind`
    index: Any = None
    indexed_seq: int = 0  # every committed row of this collection up to here is indexed
    # live (not deleted, indexed) sequence numbers: 1 bit per number up to the highest
    live: fx.LiveBits = field(default_factory=fx.LiveBits)
    live_count: int = 0
    seq_to_id: dict[int, str] = field(default_factory=dict)
    rw: _RWLock = field(default_factory=_RWLock)
    write_mutex: threading.Lock = field(default_factory=threading.Lock)
    maint_lock: threading.Lock = field(default_factory=threading.Lock)
    ckpt_lock: threading.Lock = field(default_factory=threading.Lock)
    writes_since_ckpt: int = 0
    dropped: bool = False
    _live_sel: fx.BitmapSelector | None = None
    # bumped whenever rows are added, so cached filter results know they are stale
    version: int = 0
    filter_cache: OrderedDict = field(default_factory=OrderedDict)
    cache_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- called with rw held for writing --
    def mark_live(self, seqs: np.ndarray, ids: Sequence[str]) -> None:
        if seqs.size:
            self.live.add(seqs)
            self.seq_to_id.update(zip(seqs.tolist(), ids, strict=True))
            self.live_count += int(seqs.size)
            self._live_sel = None
            self.version += 1

    def mark_dead(self, seqs: Sequence[int]) -> None:
        gone = [s for s in seqs if self.seq_to_id.pop(s, None) is not None]
        if gone:
            self.live.discard(np.asarray(gone, dtype=np.int64))
            self.live_count -= len(gone)
        self._live_sel = None

    # -- called with rw held (either mode) --
    def live_selector(self) -> fx.BitmapSelector:
        sel = self._live_sel
        if sel is None:
            sel = self._live_sel = self.live.selector()
        return sel


class _Progress:
    def __init__(self, cb: Callable[[RebuildProgress], None] | None, generation: int) -> None:
        self.cb = cb
        self.generation = generation
        self.phase = "indexing"
        self.total = 0
        self.t0 = time.monotonic()
        self.recall: float | None = None

    def start(self, phase: str, total: int) -> None:
        self.phase, self.total, self.t0 = phase, total, time.monotonic()
        self.emit(0)

    def emit(self, done: int, message: str = "", phase: str | None = None) -> None:
        if self.cb is None:
            return
        elapsed = time.monotonic() - self.t0
        rate = done / elapsed if elapsed > 0 and done else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        self.cb(
            RebuildProgress(
                phase=phase or self.phase,  # type: ignore[arg-type]
                done=done,
                total=self.total,
                rate=rate,
                eta_seconds=max(0.0, eta),
                generation=self.generation,
                recall=self.recall,
                message=message,
            )
        )


if "__dict__" in dir(Hit) and not hasattr(Hit, "__slots__"):
    _new = object.__new__

    def _hit(item_id: str, score: float, text: str, metadata: Any) -> Hit:
        # Hit is a frozen dataclass, whose __init__ (object.__setattr__ per field) costs
        # ~3x this; searches build up to top_k of them per query.
        h = _new(Hit)
        h.__dict__.update(id=item_id, score=score, text=text, metadata=metadata)
        return h

else:  # pragma: no cover - if Hit ever gains __slots__

    def _hit(item_id: str, score: float, text: str, metadata: Any) -> Hit:
        return Hit(id=item_id, score=score, text=text, metadata=metadata)


def _params_json(p: IndexParams) -> str:
    return json.dumps(asdict(p), sort_keys=True)


def _params_from(s: str) -> IndexParams:
    return IndexParams(**json.loads(s))


def _blob_matrix(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), dim)


class Engine:
    """Durable collections of vectors with metadata, searchable through FAISS.

    Thread-safe. Open one Engine per data directory (a lock file enforces it).
    """

    def __init__(
        self, data_dir: str | os.PathLike, *, checkpoint_every: int = 50_000, use_gpu: bool = False
    ) -> None:
        self._dir = Path(data_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._idx_dir = self._dir / "indexes"
        self._idx_dir.mkdir(exist_ok=True)
        self._checkpoint_every = max(1, int(checkpoint_every))
        # Unfiltered searches of flat indexes run on a GPU copy when FAISS can (faiss-gpu and
        # a device); searches with ID selectors (filters, tombstones) stay on the CPU index,
        # which remains the one that is written and checkpointed.
        self._use_gpu = bool(use_gpu) and faiss_gpu_available()
        self._gpu_res: Any = faiss.StandardGpuResources() if self._use_gpu else None
        # one GPU resource object is not safe for concurrent use: copies and searches queue
        self._gpu_lock = threading.Lock()
        self._gpu_copies: dict[int, tuple[Any, int, Any]] = {}  # coll id -> (cpu, ntotal, gpu)
        self._lock_file = open(self._dir / "LOCK", "a+")  # noqa: SIM115 - held for the Engine's life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise FailedPrecondition(
                f"data directory {self._dir.name!r} is in use by another Engine; stop it first"
            ) from None
        self._db_path = self._dir / DB_NAME
        self._db_lock = threading.Lock()
        self._closed = False
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._local = threading.local()
        self._reg_lock = threading.Lock()
        self._colls: dict[tuple[str, str], _Coll] = {}
        try:
            self._writer = connect(self._db_path)
            init_schema(self._writer)
            self._recover()
        except BaseException:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            raise

    # ------------------------------------------------------------------ plumbing

    @property
    def db_path(self) -> Path:
        return self._db_path

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise Unavailable("the index engine is closed")
            conn = connect(self._db_path)
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._db_lock:
            if self._closed:
                raise Unavailable("the index engine is closed")
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the index engine is closed")

    def _get(self, tenant: str, name: str) -> _Coll:
        self._check_open()
        coll = self._colls.get((tenant, name))
        if coll is None or coll.dropped:
            if not isinstance(name, str) or not _NAME_RE.match(name):
                self._check_name(name)
            raise NotFound(f"collection {name!r} does not exist; create it first or check the name")
        return coll

    @staticmethod
    def _check_name(name: Any) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise InvalidArgument(
                f"collection name {name!r} is invalid: use 1-128 characters of letters, digits, "
                "'_', '.' or '-'"
            )

    # ------------------------------------------------------------------ open / recovery

    def _recover(self) -> None:
        conn = self._writer
        with self._tx() as c:
            # A rebuild that was running when the process died never swapped: drop it.
            failed = c.execute(
                "SELECT coll_id, generation FROM generations WHERE state = 'building'"
            ).fetchall()
            for coll_id, gen in failed:
                c.execute(
                    "DELETE FROM staged_vectors WHERE coll_id = ? AND generation = ?",
                    (coll_id, gen),
                )
                c.execute(
                    "UPDATE generations SET state = 'failed' WHERE coll_id = ? AND generation = ?",
                    (coll_id, gen),
                )
            c.execute("DELETE FROM staged_vectors")
        rows = conn.execute(
            "SELECT id, tenant, name, dim, metric, index_type, embedder, params, generation, "
            "created_at "
            "FROM collections"
        ).fetchall()
        keep_dirs = set()
        for row in rows:
            coll = _Coll(
                id=row[0],
                tenant=row[1],
                name=row[2],
                dim=row[3],
                metric=Metric(row[4]),
                index_type=IndexType(row[5]),
                embedder=row[6],
                params=_params_from(row[7]),
                generation=row[8],
                created_at=row[9],
                dir=self._idx_dir / str(row[0]),
            )
            keep_dirs.add(coll.dir.name)
            self._clean_generation_files(coll)
            self._load_active(coll)
            self._colls[(coll.tenant, coll.name)] = coll
        for p in self._idx_dir.iterdir():
            if p.name not in keep_dirs:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    def _clean_generation_files(self, coll: _Coll) -> None:
        keep = {
            g
            for (g,) in self._writer.execute(
                "SELECT generation FROM generations WHERE coll_id = ? AND state IN ('active', "
                "'previous')",
                (coll.id,),
            )
        }
        if not coll.dir.is_dir():
            return
        for p in coll.dir.iterdir():
            parsed = fx.parse_checkpoint_name(p.name)
            if parsed is None or parsed[0] not in keep:
                p.unlink(missing_ok=True)

    def _gen_row(self, conn: sqlite3.Connection, coll_id: int, generation: int) -> tuple:
        row = conn.execute(
            "SELECT built_kind, params, dim FROM generations WHERE coll_id = ? AND generation = ?",
            (coll_id, generation),
        ).fetchone()
        if row is None:
            raise RuntimeError(
                f"generation {generation} of collection {coll_id} is missing from the store"
            )
        return IndexType(row[0]), _params_from(row[1]), row[2]

    def _load_active(self, coll: _Coll) -> None:
        """Load the active generation's index from its checkpoint and catch up from the
        store (or build it from the store), and the live-set bookkeeping."""
        conn = self._writer
        kind, rparams, _dim = self._gen_row(conn, coll.id, coll.generation)
        coll.kind, coll.rparams = kind, rparams
        coll.index = self._index_from_store(conn, coll, coll.generation, kind, rparams)
        live = conn.execute(
            "SELECT seq, item_id FROM items WHERE coll_id = ? AND deleted = 0 ORDER BY seq",
            (coll.id,),
        ).fetchall()
        seqs = np.fromiter((r[0] for r in live), dtype=np.int64, count=len(live))
        coll.live = fx.LiveBits(int(seqs.max()) + 1 if seqs.size else 1024)
        coll.live_count = 0
        coll.seq_to_id = {}
        coll.mark_live(seqs, [r[1] for r in live])
        (top,) = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM items WHERE coll_id = ?", (coll.id,)
        ).fetchone()
        coll.indexed_seq = top

    def _index_from_store(
        self,
        conn: sqlite3.Connection,
        coll: _Coll,
        generation: int,
        kind: IndexType,
        rparams: IndexParams,
    ) -> Any:
        loaded = fx.load_checkpoint(coll.dir, generation)
        index = None
        after = 0
        if loaded is not None:
            index, after = loaded
            if index.d != coll.dim or index.metric_type != fx.faiss_metric(coll.metric):
                log.warning(
                    "checkpoint of %s/%s does not match its collection; rebuilding",
                    coll.tenant,
                    coll.name,
                )
                index, after = None, 0
        if index is None:
            if kind == IndexType.IVF_PQ:  # no usable checkpoint: train again on the store
                _, vecs = self._read_vectors(conn, coll, 0, None)
                index = fx.new_index(kind, coll.dim, coll.metric, rparams, len(vecs))
                index.train(vecs)
            else:
                index = fx.new_index(kind, coll.dim, coll.metric, rparams)
        for seqs, vecs in self._iter_vectors(conn, coll, after, None):
            index.add_with_ids(vecs, seqs)
        return index

    def _iter_vectors(
        self,
        conn: sqlite3.Connection,
        coll: _Coll,
        after: int,
        upto: int | None,
        *,
        text: bool = False,
    ) -> Iterator[Any]:
        """Live rows with after < seq <= upto, in seq order, as batches of
        (seqs, vectors) or, with `text`, (seqs, vectors, texts)."""
        last = after
        hi = upto if upto is not None else (1 << 62)
        while True:
            rows = conn.execute(
                "SELECT seq, vector" + (", text" if text else "") + " FROM items "
                "WHERE coll_id = ? AND deleted = 0 AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                (coll.id, last, hi, _READ_BATCH),
            ).fetchall()
            if not rows:
                return
            seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vecs = _blob_matrix([r[1] for r in rows], coll.dim)
            last = int(seqs[-1])
            if text:
                yield seqs, vecs, [r[2] for r in rows]
            else:
                yield seqs, vecs

    def _read_vectors(
        self, conn: sqlite3.Connection, coll: _Coll, after: int, upto: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        parts = list(self._iter_vectors(conn, coll, after, upto))
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros((0, coll.dim), dtype=np.float32)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    # ------------------------------------------------------------------ checkpoints / close

    def _checkpoint(self, coll: _Coll) -> None:
        with coll.ckpt_lock:
            with coll.rw.read():
                if coll.dropped:
                    return
                staged = fx.stage_checkpoint(coll.dir, coll.index)
                seq, gen = coll.indexed_seq, coll.generation
                coll.writes_since_ckpt = 0
            fx.commit_checkpoint(coll.dir, gen, seq, staged)

    def checkpoint(self) -> None:
        """Checkpoint every collection's index now."""
        self._check_open()
        for coll in list(self._colls.values()):
            self._checkpoint(coll)

    def close(self) -> None:
        """Checkpoint all indexes and close the store. Idempotent."""
        if self._closed:
            return
        try:
            for coll in list(self._colls.values()):
                try:
                    self._checkpoint(coll)
                except Exception:  # a failed checkpoint only costs catch-up time at next open
                    log.exception("checkpoint of %s/%s failed at close", coll.tenant, coll.name)
        finally:
            with self._db_lock:
                self._closed = True
                self._writer.close()
            with self._conns_lock:
                for c in self._conns:
                    c.close()
                self._conns.clear()
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ collections

    def create_collection(
        self,
        tenant: str,
        name: str,
        *,
        dim: int,
        metric: Metric,
        index_type: IndexType,
        embedder: str,
        params: IndexParams = IndexParams(),  # noqa: B008 - frozen
    ) -> CollectionInfo:
        """Create an empty collection. Raises AlreadyExists if (tenant, name) is taken."""
        self._check_open()
        self._check_name(name)
        if not isinstance(tenant, str) or not tenant:
            raise InvalidArgument("tenant must be a non-empty string")
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
            raise InvalidArgument(f"dim must be an integer from 1 to {MAX_DIM}, got {dim!r}")
        metric = self._enum(Metric, metric, "metric")
        index_type = self._enum(IndexType, index_type, "index_type")
        if not isinstance(params, IndexParams):
            raise InvalidArgument("params must be IndexParams")
        try:
            fx.validate_params(index_type, dim, params)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if not isinstance(embedder, str):
            raise InvalidArgument("embedder must be a string (name@version)")
        # ivf_pq needs training data: serve exactly until a rebuild can train it
        kind = IndexType.FLAT if index_type == IndexType.IVF_PQ else index_type
        rparams = fx.resolve_params(kind, dim, params)
        now = time.time()
        with self._reg_lock:
            existing = self._colls.get((tenant, name))
            if existing is not None and not existing.dropped:
                raise AlreadyExists(
                    f"collection {name!r} already exists; pick another name or delete it first"
                )
            with self._tx() as c:
                cur = c.execute(
                    "INSERT INTO collections (tenant, name, dim, metric, index_type, embedder, "
                    "params, "
                    "generation, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                    (
                        tenant,
                        name,
                        dim,
                        metric.value,
                        index_type.value,
                        embedder,
                        _params_json(params),
                        now,
                    ),
                )
                coll_id = cur.lastrowid
                c.execute(
                    "INSERT INTO generations (coll_id, generation, index_type, built_kind, "
                    "params, requested, "
                    "embedder, dim, state, created_at) VALUES (?, 1, ?, ?, ?, ?, ?, ?, 'active', "
                    "?)",
                    (
                        coll_id,
                        index_type.value,
                        kind.value,
                        _params_json(rparams),
                        _params_json(params),
                        embedder,
                        dim,
                        now,
                    ),
                )
            coll = _Coll(
                id=coll_id,
                tenant=tenant,
                name=name,
                dim=dim,
                metric=metric,
                index_type=index_type,
                embedder=embedder,
                params=params,
                generation=1,
                created_at=now,
                dir=self._idx_dir / str(coll_id),
                kind=kind,
                rparams=rparams,
                index=fx.new_index(kind, dim, metric, rparams),
            )
            self._colls[(tenant, name)] = coll
        return self._info(coll)

    @staticmethod
    def _enum(cls: Any, value: Any, what: str) -> Any:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise InvalidArgument(f"unknown {what} {value!r}; expected one of {allowed}") from None

    def delete_collection(self, tenant: str, name: str) -> None:
        with self._reg_lock:
            coll = self._get(tenant, name)
            with coll.write_mutex:
                with self._tx() as c:
                    for table in ("items", "generations", "staged_vectors", "prev_vectors"):
                        c.execute(f"DELETE FROM {table} WHERE coll_id = ?", (coll.id,))
                    c.execute("DELETE FROM collections WHERE id = ?", (coll.id,))
                with coll.rw.write():
                    coll.dropped = True
                del self._colls[(tenant, name)]
        with coll.ckpt_lock:
            shutil.rmtree(coll.dir, ignore_errors=True)

    def list_collections(self, tenant: str) -> list[CollectionInfo]:
        self._check_open()
        colls = [c for (t, _), c in list(self._colls.items()) if t == tenant and not c.dropped]
        return [self._info(c) for c in sorted(colls, key=lambda c: c.name)]

    def list_all_collections(self) -> list[CollectionInfo]:
        """Every collection of every tenant (for sweepers and admin status)."""
        self._check_open()
        colls = [c for c in list(self._colls.values()) if not c.dropped]
        return [self._info(c) for c in sorted(colls, key=lambda c: (c.tenant, c.name))]

    def describe(self, tenant: str, name: str) -> CollectionInfo:
        return self._info(self._get(tenant, name))

    def _info(self, coll: _Coll) -> CollectionInfo:
        with coll.rw.read():
            ntotal = coll.index.ntotal
            live = coll.live_count
            params = coll.rparams if coll.kind == coll.index_type else coll.params
            return CollectionInfo(
                name=coll.name,
                tenant=coll.tenant,
                dim=coll.dim,
                metric=coll.metric,
                index_type=coll.index_type,
                embedder=coll.embedder,
                generation=coll.generation,
                count=live,
                tombstones=max(0, ntotal - live),
                params=params,
                created_at=coll.created_at,
            )

    def set_embedder(self, tenant: str, name: str, embedder: str) -> None:
        """Record that the collection's vectors come from `embedder` (name@version)."""
        if not isinstance(embedder, str) or not embedder:
            raise InvalidArgument("embedder must be a non-empty string (name@version)")
        coll = self._get(tenant, name)
        with coll.write_mutex:
            with self._tx() as c:
                c.execute("UPDATE collections SET embedder = ? WHERE id = ?", (embedder, coll.id))
                c.execute(
                    "UPDATE generations SET embedder = ? WHERE coll_id = ? AND generation = ?",
                    (embedder, coll.id, coll.generation),
                )
            coll.embedder = embedder

    # ------------------------------------------------------------------ writes

    def _prepare_vectors(self, coll: _Coll, records: Sequence[Record]) -> np.ndarray:
        n = len(records)
        dim = coll.dim
        mat = np.empty((n, dim), dtype=np.float32)
        for i, r in enumerate(records):
            v = r.vector
            if v is None:
                raise InvalidArgument(f"item {i} (id {r.id!r}) has no vector; embed its text first")
            try:
                a = np.asarray(v, dtype=np.float32)
            except (TypeError, ValueError):
                raise InvalidArgument(
                    f"item {i} (id {r.id!r}): vector is not a list of numbers"
                ) from None
            if a.shape != (dim,):
                got = a.shape[0] if a.ndim == 1 else "x".join(map(str, a.shape))
                raise InvalidArgument(
                    f"item {i} (id {r.id!r}): vector has dimension {got}, collection "
                    f"{coll.name!r} expects {dim}"
                )
            mat[i] = a
        finite = np.isfinite(mat).all(axis=1)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise InvalidArgument(
                f"item {i} (id {records[i].id!r}): vector contains NaN or infinity"
            )
        if coll.metric == Metric.COSINE:
            norms = np.linalg.norm(mat, axis=1)
            if not (norms > 0).all():
                i = int(np.flatnonzero(~(norms > 0))[0])
                raise InvalidArgument(
                    f"item {i} (id {records[i].id!r}): zero vector cannot be normalised for cosine"
                )
            mat /= norms[:, None]
        return mat

    def upsert(self, tenant: str, name: str, records: Sequence[Record]) -> int:
        """Insert or replace `records` (each with a vector) in one transaction.

        Returns the number written. Replacing an id tombstones its previous vector.
        """
        coll = self._get(tenant, name)
        if not records:
            raise InvalidArgument("records is empty; send at least one item")
        seen: set[str] = set()
        rows = []
        for i, r in enumerate(records):
            if not isinstance(r, Record):
                raise InvalidArgument(f"item {i} is not a Record")
            if not isinstance(r.id, str) or not r.id:
                raise InvalidArgument(f"item {i} has an empty id; every item needs a unique id")
            if len(r.id) > MAX_ID_LEN:
                raise InvalidArgument(f"item {i}: id is longer than {MAX_ID_LEN} characters")
            if r.id in seen:
                raise InvalidArgument(
                    f"item {i}: id {r.id!r} appears more than once in this request"
                )
            seen.add(r.id)
            if not isinstance(r.text, str):
                raise InvalidArgument(f"item {i} (id {r.id!r}): text must be a string")
            try:
                md = json.dumps(dict(r.metadata or {}), allow_nan=False, separators=(",", ":"))
            except (TypeError, ValueError) as e:
                raise InvalidArgument(
                    f"item {i} (id {r.id!r}): metadata is not a JSON object ({e})"
                ) from None
            rows.append((r.id, r.text, md))
        mat = self._prepare_vectors(coll, records)
        ids = [r[0] for r in rows]
        with coll.write_mutex:
            if coll.dropped:
                raise NotFound(f"collection {name!r} was deleted")
            if mat.shape[1] != coll.dim:  # the collection was re-embedded to another dim meanwhile
                mat = self._prepare_vectors(coll, records)
            seqs = np.empty(len(rows), dtype=np.int64)
            with self._tx() as c:
                old = c.execute(
                    # without INDEXED BY the planner (no ANALYZE stats) scans every live row
                    "UPDATE items INDEXED BY items_live_id SET deleted = 1 "
                    "WHERE coll_id = ? AND deleted = 0 AND item_id IN "
                    "(SELECT value FROM json_each(?)) RETURNING seq",
                    (coll.id, json.dumps(ids)),
                ).fetchall()
                ins = (
                    "INSERT INTO items (coll_id, item_id, vector, text, metadata) "
                    "VALUES (?, ?, ?, ?, ?)"
                )
                for i, (item_id, text, md) in enumerate(rows):
                    seqs[i] = c.execute(
                        ins, (coll.id, item_id, mat[i].tobytes(), text, md)
                    ).lastrowid
            n = len(rows)
            chunk = _HNSW_ADD_CHUNK if coll.kind == IndexType.HNSW else n
            with coll.rw.write():
                coll.mark_dead([s for (s,) in old])
            for lo in range(0, n, chunk):
                hi = min(n, lo + chunk)
                with coll.rw.write():
                    coll.index.add_with_ids(mat[lo:hi], seqs[lo:hi])
                    coll.mark_live(seqs[lo:hi], ids[lo:hi])
                    coll.indexed_seq = int(seqs[hi - 1])
            with coll.rw.write():
                coll.writes_since_ckpt += n
                due = coll.writes_since_ckpt >= self._checkpoint_every
        if due:
            self._checkpoint(coll)
        return len(rows)

    def delete(
        self,
        tenant: str,
        name: str,
        *,
        ids: Sequence[str] | None = None,
        filter: Filter | None = None,
    ) -> int:
        """Tombstone items by ids or by filter (exactly one). Returns how many were deleted."""
        coll = self._get(tenant, name)
        if (ids is None) == (filter is None):
            raise InvalidArgument("pass either ids or a filter to delete")
        if ids is not None:
            if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
                raise InvalidArgument("ids must be a list of strings")
            where, args = "item_id IN (SELECT value FROM json_each(?))", [json.dumps(list(ids))]
            table = "items INDEXED BY items_live_id"
        else:
            if filter is not None and filter.is_empty():
                raise InvalidArgument(
                    "an empty filter would delete everything; delete the collection instead"
                )
            where, args = compile_filter(filter)
            table = "items"
        with coll.write_mutex:
            if coll.dropped:
                raise NotFound(f"collection {name!r} was deleted")
            with self._tx() as c:
                gone = c.execute(
                    f"UPDATE {table} SET deleted = 1 WHERE coll_id = ? AND deleted = 0 AND "
                    f"({where}) RETURNING seq",
                    [coll.id, *args],
                ).fetchall()
            with coll.rw.write():
                coll.mark_dead([s for (s,) in gone])
                coll.writes_since_ckpt += len(gone)
        return len(gone)

    # ------------------------------------------------------------------ reads

    def get(
        self, tenant: str, name: str, ids: Sequence[str], *, include_vectors: bool = False
    ) -> list[Record]:
        """Live records for `ids`, in request order; ids that do not exist are left out."""
        coll = self._get(tenant, name)
        if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
            raise InvalidArgument("ids must be a list of strings")
        if not ids:
            return []
        cols = "item_id, text, metadata" + (", vector" if include_vectors else "")
        rows = (
            self._reader()
            .execute(
                f"SELECT {cols} FROM items INDEXED BY items_live_id "
                "WHERE coll_id = ? AND deleted = 0 AND item_id IN "
                "(SELECT value FROM json_each(?))",
                (coll.id, json.dumps(list(ids))),
            )
            .fetchall()
        )
        by_id = {r[0]: r for r in rows}
        out, seen = [], set()
        for i in ids:
            r = by_id.get(i)
            if r is None or i in seen:
                continue
            seen.add(i)
            vec = np.frombuffer(r[3], dtype=np.float32).copy() if include_vectors else None
            out.append(Record(id=i, vector=vec, text=r[1], metadata=json.loads(r[2])))
        return out

    def iter_records(self, tenant: str, name: str, batch: int = 1024) -> Iterator[list[Record]]:
        """Live records with vectors in a stable (write) order, `batch` at a time."""
        coll = self._get(tenant, name)
        if batch <= 0:
            raise InvalidArgument("batch must be positive")
        last = 0
        while True:
            rows = (
                self._reader()
                .execute(
                    "SELECT seq, item_id, vector, text, metadata FROM items "
                    "WHERE coll_id = ? AND deleted = 0 AND seq > ? ORDER BY seq LIMIT ?",
                    (coll.id, last, batch),
                )
                .fetchall()
            )
            if not rows:
                return
            last = rows[-1][0]
            yield [
                Record(
                    id=r[1],
                    vector=np.frombuffer(r[2], dtype=np.float32).copy(),
                    text=r[3],
                    metadata=json.loads(r[4]),
                )
                for r in rows
            ]

    def count_matching(self, tenant: str, name: str, filter: Filter | None) -> int:
        """How many live items match `filter` (all live items when None or empty)."""
        coll = self._get(tenant, name)
        if filter is None or filter.is_empty():
            compile_filter(filter)
            return coll.live_count
        matching = self._matching(coll, filter)
        with coll.rw.read():
            return int(np.count_nonzero(coll.live.contains(matching)))

    def _matching(self, coll: _Coll, flt: Filter) -> np.ndarray:
        """Sequence numbers of the rows matching `flt` (possibly including rows deleted
        since: callers intersect with the live set). Results are cached per collection
        until rows are added, so a repeated filter skips the SQLite scan."""
        where, args = compile_filter(flt)
        key = (where, tuple(args))
        version = coll.version
        with coll.cache_lock:
            hit = coll.filter_cache.get(key)
            if hit is not None and hit[0] == version:
                coll.filter_cache.move_to_end(key)
                return hit[1]
        rows = (
            self._reader()
            .execute(
                f"SELECT seq FROM items WHERE coll_id = ? AND deleted = 0 AND ({where})",
                [coll.id, *args],
            )
            .fetchall()
        )
        matching = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        matching.setflags(write=False)
        with coll.cache_lock:
            coll.filter_cache[key] = (version, matching)
            coll.filter_cache.move_to_end(key)
            while len(coll.filter_cache) > _FILTER_CACHE_SIZE:
                coll.filter_cache.popitem(last=False)
        return matching

    def _check_queries(self, coll: _Coll, queries: Any) -> np.ndarray:
        try:
            q = np.asarray(queries, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidArgument("query vectors must be numbers") from None
        if q.ndim == 1:
            q = q[None, :]
        if q.ndim != 2 or q.shape[0] == 0:
            raise InvalidArgument("queries must be a non-empty [n, dim] array")
        if q.shape[1] != coll.dim:
            raise InvalidArgument(
                f"query has dimension {q.shape[1]}, collection {coll.name!r} expects {coll.dim}"
            )
        if not np.isfinite(q).all():
            raise InvalidArgument("query vector contains NaN or infinity")
        if coll.metric == Metric.COSINE:
            norms = np.sqrt(np.einsum("ij,ij->i", q, q))
            if not (norms > 0).all():
                raise InvalidArgument("zero query vector cannot be normalised for cosine")
            q = q / norms[:, None]
        return np.ascontiguousarray(q, dtype=np.float32)

    def search(
        self,
        tenant: str,
        name: str,
        queries: np.ndarray,
        top_k: int,
        *,
        filter: Filter | None = None,
        include_text: bool = False,
        include_metadata: bool = False,
    ) -> list[SearchResult]:
        """Nearest live items to each row of `queries` ([n, dim] or [dim]), best first.

        One FAISS call serves all rows. Scores are higher-is-better for every metric
        (l2: negative squared distance). With a filter, results fill `top_k` whenever that
        many live items match; `exhaustive` says whether the result is exact.
        """
        coll = self._get(tenant, name)
        if (
            isinstance(top_k, bool)
            or not isinstance(top_k, (int, np.integer))
            or not 1 <= top_k <= MAX_TOP_K
        ):
            raise InvalidArgument(f"top_k must be from 1 to {MAX_TOP_K}, got {top_k!r}")
        k = int(top_k)
        q = self._check_queries(coll, queries)
        nq = q.shape[0]
        matching = None
        if filter is not None and not filter.is_empty():
            matching = self._matching(coll, filter)
        elif filter is not None:
            compile_filter(filter)

        with coll.rw.read():
            if coll.dropped:
                raise NotFound(f"collection {name!r} was deleted")
            if matching is not None:
                # deleted since, or committed but not yet indexed: left out
                matching = matching[coll.live.contains(matching)]
                n_candidates = int(matching.size)
            else:
                n_candidates = coll.live_count
            if n_candidates == 0:
                return [SearchResult(hits=(), returned_k=0, exhaustive=True) for _ in range(nq)]
            kind = coll.kind
            exhaustive = kind == IndexType.FLAT
            exact_rows: np.ndarray | None = None
            if (
                matching is not None
                and not exhaustive
                and (
                    n_candidates <= EXACT_SCAN_MAX
                    or n_candidates <= EXACT_SCAN_FRACTION * coll.live_count
                )
            ):
                dist, lab = self._exact(coll, q, k, matching)
                exhaustive = True
            else:
                if matching is not None:
                    mask = np.zeros(coll.live.capacity, dtype=bool)
                    mask[matching] = True
                    sel: Any = fx.BitmapSelector(mask)
                elif coll.index.ntotal > coll.live_count:
                    sel = coll.live_selector()
                else:
                    sel = None
                if self._use_gpu and kind == IndexType.FLAT and sel is None and k <= _GPU_MAX_K:
                    dist, lab = self._gpu_search(coll, q, k)
                elif kind == IndexType.FLAT and nq >= fx.BLAS_MIN_QUERIES:
                    if matching is not None:
                        allowed = _mask_lookup(mask)
                    elif sel is not None:
                        allowed = coll.live.contains
                    else:
                        allowed = None
                    dist, lab = fx.flat_batch_search(coll.index, q, k, coll.metric, allowed)
                else:
                    params = fx.search_params(
                        kind, coll.rparams, k, sel.sel if sel is not None else None
                    )
                    dist, lab = coll.index.search(q, k, params=params)
                if not exhaustive:
                    # an approximate index may come back short under a filter or many
                    # tombstones: redo those rows exactly so top_k is filled
                    need = min(k, n_candidates)
                    short = np.flatnonzero((lab >= 0).sum(axis=1) < need)
                    if short.size:
                        cand = matching if matching is not None else coll.live.to_array()
                        dist2, lab2 = self._exact(coll, q[short], k, cand)
                        dist[short], lab[short] = dist2, lab2
                        exact_rows = short
            id_of = coll.seq_to_id
            if coll.metric == Metric.L2:
                dist = -dist
            dl, il = dist.tolist(), lab.tolist()
            results_raw = []
            for drow, irow in zip(dl, il, strict=True):
                hits = []
                for s, seq in zip(drow, irow, strict=True):
                    if seq < 0:
                        break
                    item_id = id_of.get(seq)
                    if item_id is not None:
                        hits.append((seq, item_id, s))
                results_raw.append(hits)

        extra: dict[int, tuple[str, Any]] = {}
        if include_text or include_metadata:
            want = sorted({h[0] for hits in results_raw for h in hits})
            if want:
                for seq, text, md in self._reader().execute(
                    "SELECT seq, text, metadata FROM items WHERE seq IN (SELECT value FROM "
                    "json_each(?))",
                    (json.dumps(want),),
                ):
                    extra[seq] = (
                        text if include_text else "",
                        json.loads(md) if include_metadata else {},
                    )
        out = []
        for row, hits in enumerate(results_raw):
            if extra:
                hl = [_hit(i, s, extra[q_][0], extra[q_][1]) for q_, i, s in hits]
            else:
                hl = [_hit(i, s, "", {}) for _, i, s in hits]
            row_exact = exhaustive or (exact_rows is not None and row in exact_rows)
            out.append(SearchResult(hits=hl, returned_k=len(hl), exhaustive=bool(row_exact)))
        return out

    def _gpu_search(self, coll: _Coll, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Search a GPU copy of coll's flat index, copied again once rows were added or the
        index was replaced (flat indexes only grow in place). Called under rw read."""
        with self._gpu_lock:
            cached = self._gpu_copies.get(coll.id)
            if cached is None or cached[0] is not coll.index or cached[1] != coll.index.ntotal:
                gpu = faiss.index_cpu_to_gpu(self._gpu_res, 0, coll.index)
                cached = (coll.index, coll.index.ntotal, gpu)
                self._gpu_copies[coll.id] = cached
            return cached[2].search(q, k)

    def _exact(
        self, coll: _Coll, q: np.ndarray, k: int, seqs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of `q` over the vectors of `seqs` (live, indexed). Called under rw."""
        if coll.kind == IndexType.IVF_PQ:  # PQ codes are lossy: read the stored vectors
            rows = (
                self._reader()
                .execute(
                    "SELECT seq, vector FROM items WHERE seq IN (SELECT value FROM json_each(?)) "
                    "ORDER BY seq",
                    (json.dumps(seqs.tolist()),),
                )
                .fetchall()
            )
            seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            X = _blob_matrix([r[1] for r in rows], coll.dim)
        else:
            X = coll.index.reconstruct_batch(seqs)
        kk = min(k, X.shape[0])
        dist = np.full(
            (q.shape[0], k), -np.inf if coll.metric != Metric.L2 else np.inf, dtype=np.float32
        )
        lab = np.full((q.shape[0], k), -1, dtype=np.int64)
        if kk:
            d, pos = faiss.knn(q, np.ascontiguousarray(X), kk, metric=fx.faiss_metric(coll.metric))
            dist[:, :kk] = d
            lab[:, :kk] = np.where(pos >= 0, seqs[np.maximum(pos, 0)], -1)
        return dist, lab

    # ------------------------------------------------------------------ rebuild / rollback

    def rebuild(
        self,
        tenant: str,
        name: str,
        *,
        index_type: IndexType | None = None,
        params: IndexParams | None = None,
        reembed: Callable[[list[str]], np.ndarray] | None = None,
        embedder: str | None = None,
        min_recall: float = 0.95,
        progress: Callable[[RebuildProgress], None] | None = None,
    ) -> CollectionInfo:
        """Build a new index generation from the store and swap it in atomically.

        Searches and upserts keep working meanwhile; upserts that land during the build are
        added before the swap. With `reembed`, every item's text is re-embedded (the new
        vectors replace the stored ones at the swap; the old ones are kept for rollback).
        Raises FailedPrecondition, after a "refused" progress report, when the new
        generation's recall@10 against exact search is below `min_recall`; the old
        generation keeps serving. Blocking: call it from a worker thread.
        """
        coll = self._get(tenant, name)
        target = (
            self._enum(IndexType, index_type, "index_type")
            if index_type is not None
            else coll.index_type
        )
        if params is None:
            params = coll.params if target == coll.index_type else IndexParams()
        if not isinstance(params, IndexParams):
            raise InvalidArgument("params must be IndexParams")
        try:
            fx.validate_params(target, coll.dim, params)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if not isinstance(min_recall, (int, float)) or not 0.0 <= min_recall <= 1.0:
            raise InvalidArgument(f"min_recall must be between 0 and 1, got {min_recall!r}")
        new_embedder = embedder if embedder is not None else coll.embedder
        if new_embedder != coll.embedder and reembed is None:
            raise InvalidArgument(
                "changing the embedder needs reembed: the stored vectors come from the old one"
            )
        if not coll.maint_lock.acquire(blocking=False):
            raise FailedPrecondition(
                f"a rebuild, rollback or compaction of {name!r} is already running; wait for it "
                "to finish"
            )
        try:
            return self._rebuild(
                coll, target, params, reembed, new_embedder, float(min_recall), progress
            )
        finally:
            coll.maint_lock.release()

    def _embed(
        self, reembed: Callable[[list[str]], np.ndarray], texts: list[str], metric: Metric
    ) -> np.ndarray:
        try:
            out = np.asarray(reembed(texts), dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise FailedPrecondition(
                f"re-embedding returned something that is not a vector array: {e}"
            ) from None
        if out.ndim != 2 or out.shape[0] != len(texts):
            raise FailedPrecondition(
                f"re-embedding {len(texts)} texts returned an array of shape {out.shape}"
            )
        if not np.isfinite(out).all():
            raise FailedPrecondition("re-embedding returned NaN or infinity")
        if metric == Metric.COSINE:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out = out / np.where(norms > 0, norms, 1.0)
        return np.ascontiguousarray(out, dtype=np.float32)

    def _rebuild(
        self,
        coll: _Coll,
        target: IndexType,
        params: IndexParams,
        reembed: Callable[[list[str]], np.ndarray] | None,
        new_embedder: str,
        min_recall: float,
        progress_cb: Callable[[RebuildProgress], None] | None,
    ) -> CollectionInfo:
        conn = self._reader()
        with coll.write_mutex:
            snap = coll.indexed_seq
            old_gen = coll.generation
            (gen,) = conn.execute(
                "SELECT COALESCE(MAX(generation), 0) + 1 FROM generations WHERE coll_id = ?",
                (coll.id,),
            ).fetchone()
            with self._tx() as c:
                c.execute(
                    "INSERT INTO generations (coll_id, generation, index_type, built_kind, "
                    "params, requested, "
                    "embedder, dim, state, created_at) VALUES (?, ?, ?, ?, '{}', ?, ?, ?, "
                    "'building', ?)",
                    (
                        coll.id,
                        gen,
                        target.value,
                        target.value,
                        _params_json(params),
                        new_embedder,
                        coll.dim,
                        time.time(),
                    ),
                )
        prog = _Progress(progress_cb, gen)
        try:
            (total,) = conn.execute(
                "SELECT COUNT(*) FROM items WHERE coll_id = ? AND deleted = 0 AND seq <= ?",
                (coll.id, snap),
            ).fetchone()
            dim = coll.dim
            if reembed is not None:
                prog.start("embedding", total)
                seq_parts, vec_parts, done = [], [], 0
                for seqs, _, texts in self._iter_vectors(conn, coll, 0, snap, text=True):
                    for lo in range(0, len(texts), _REEMBED_BATCH):
                        vecs = self._embed(reembed, texts[lo : lo + _REEMBED_BATCH], coll.metric)
                        if vec_parts and vecs.shape[1] != vec_parts[0].shape[1]:
                            raise FailedPrecondition(
                                "re-embedding returned vectors of varying dimension"
                            )
                        s = seqs[lo : lo + _REEMBED_BATCH]
                        self._stage(coll.id, gen, s, vecs)
                        seq_parts.append(s)
                        vec_parts.append(vecs)
                        done += len(s)
                        prog.emit(done)
                seqs_all = np.concatenate(seq_parts) if seq_parts else np.zeros(0, dtype=np.int64)
                vecs_all = (
                    np.concatenate(vec_parts) if vec_parts else np.zeros((0, dim), dtype=np.float32)
                )
                if vec_parts:
                    dim = vecs_all.shape[1]
            else:
                seqs_all, vecs_all = self._read_vectors(conn, coll, 0, snap)
            n = int(seqs_all.size)
            kind, rparams, note = self._plan_kind(target, dim, params, n)
            index = fx.new_index(kind, dim, coll.metric, rparams, n)
            prog.start("indexing", n)
            if kind == IndexType.IVF_PQ:
                index.train(vecs_all)
            for lo in range(0, n, _ADD_BATCH):
                index.add_with_ids(vecs_all[lo : lo + _ADD_BATCH], seqs_all[lo : lo + _ADD_BATCH])
                prog.emit(min(n, lo + _ADD_BATCH), note)
            prog.start("checking", n)
            recall = recall_at_k(
                index,
                vecs_all,
                seqs_all,
                fx.faiss_metric(coll.metric),
                fx.search_params(kind, rparams, 10, None),
            )
            prog.recall = recall
            prog.emit(n, f"recall@10 {recall:.4f} against exact search")
            if recall < min_recall:
                msg = (
                    f"new generation {gen} of {coll.name!r} reached recall@10 {recall:.4f}, below "
                    "the required "
                    f"{min_recall}; generation {old_gen} keeps serving. Raise hnsw_ef_search / "
                    "ivf_nprobe / pq_m, "
                    f"or lower min_recall"
                )
                prog.emit(n, msg, phase="refused")
                raise FailedPrecondition(msg)
            # durable before the swap, so a crash right after it loads this and catches up;
            # under ckpt_lock, which delete_collection holds to remove the directory
            with coll.ckpt_lock:
                if coll.dropped:
                    raise NotFound(f"collection {coll.name!r} was deleted during the rebuild")
                fx.write_checkpoint(coll.dir, gen, snap, index)
            old_index = self._swap(
                coll, gen, index, kind, rparams, target, params, new_embedder, dim, snap, reembed
            )
        except BaseException:
            self._abandon(coll, gen)
            raise
        # keep the old generation loadable for rollback without a full rebuild
        try:
            with coll.ckpt_lock:
                if not coll.dropped:
                    fx.write_checkpoint(coll.dir, old_gen, old_index[1], old_index[0])
        except Exception:
            log.exception("could not checkpoint previous generation %d of %s", old_gen, coll.name)
        self._checkpoint(coll)
        prog.start("swapped", n)
        prog.emit(n, f"generation {gen} is serving; generation {old_gen} is kept for rollback")
        return self._info(coll)

    def _plan_kind(
        self, target: IndexType, dim: int, params: IndexParams, n: int
    ) -> tuple[IndexType, IndexParams, str]:
        try:
            fx.validate_params(target, dim, params)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if target == IndexType.IVF_PQ:
            rp = fx.resolve_params(target, dim, params, n)
            if not fx.ivf_trainable(n, rp):
                note = (
                    f"{n} items are too few to train ivf_pq; "
                    "serving an exact flat index until a later rebuild"
                )
                return IndexType.FLAT, fx.resolve_params(IndexType.FLAT, dim, params), note
            return target, rp, ""
        return target, fx.resolve_params(target, dim, params), ""

    def _stage(self, coll_id: int, gen: int, seqs: np.ndarray, vecs: np.ndarray) -> None:
        with self._tx() as c:
            c.executemany(
                "INSERT OR REPLACE INTO staged_vectors (coll_id, generation, seq, vector) VALUES "
                "(?, ?, ?, ?)",
                [(coll_id, gen, int(s), v.tobytes()) for s, v in zip(seqs, vecs, strict=True)],
            )

    def _abandon(self, coll: _Coll, gen: int) -> None:
        try:
            with self._tx() as c:
                c.execute(
                    "DELETE FROM staged_vectors WHERE coll_id = ? AND generation = ?",
                    (coll.id, gen),
                )
                c.execute(
                    "UPDATE generations SET state = 'failed' WHERE coll_id = ? AND generation = ? "
                    "AND state = 'building'",
                    (coll.id, gen),
                )
        except Exception:
            log.exception("could not mark generation %d of %s failed", gen, coll.name)
        with coll.ckpt_lock:  # delete_collection removes the directory under this lock
            for _, p, _ in fx.checkpoint_files(coll.dir, gen):
                p.unlink(missing_ok=True)

    def _swap(
        self,
        coll: _Coll,
        gen: int,
        index: Any,
        kind: IndexType,
        rparams: IndexParams,
        target: IndexType,
        params: IndexParams,
        new_embedder: str,
        dim: int,
        snap: int,
        reembed: Callable[[list[str]], np.ndarray] | None,
    ) -> tuple[Any, int]:
        """Catch the new index up with writes since `snap` and make it the active generation.
        Returns the old (index, covered seq)."""
        conn = self._reader()
        with coll.write_mutex:
            if coll.dropped:
                raise NotFound(f"collection {coll.name!r} was deleted during the rebuild")
            for seqs, vecs, texts in self._iter_vectors(conn, coll, snap, None, text=True):
                if reembed is not None:
                    vecs = np.concatenate(
                        [
                            self._embed(reembed, texts[lo : lo + _REEMBED_BATCH], coll.metric)
                            for lo in range(0, len(texts), _REEMBED_BATCH)
                        ]
                    )
                    self._stage(coll.id, gen, seqs, vecs)
                index.add_with_ids(vecs, seqs)
            old_gen = coll.generation
            with self._tx() as c:
                retired = [
                    g
                    for (g,) in c.execute(
                        "SELECT generation FROM generations WHERE coll_id = ? AND state = "
                        "'previous'",
                        (coll.id,),
                    )
                ]
                c.execute("DELETE FROM prev_vectors WHERE coll_id = ?", (coll.id,))
                if reembed is not None:
                    c.execute(
                        "INSERT INTO prev_vectors (coll_id, generation, seq, vector) SELECT "
                        "coll_id, ?, seq, vector "
                        "FROM items WHERE coll_id = ? AND seq IN "
                        "(SELECT seq FROM staged_vectors WHERE coll_id = ? AND generation = ?)",
                        (old_gen, coll.id, coll.id, gen),
                    )
                    c.execute(
                        "UPDATE items SET vector = (SELECT s.vector FROM staged_vectors s WHERE "
                        "s.coll_id = ? "
                        "AND s.generation = ? AND s.seq = items.seq) WHERE coll_id = ? AND seq IN "
                        "(SELECT seq FROM staged_vectors WHERE coll_id = ? AND generation = ?)",
                        (coll.id, gen, coll.id, coll.id, gen),
                    )
                    c.execute(
                        "DELETE FROM staged_vectors WHERE coll_id = ? AND generation = ?",
                        (coll.id, gen),
                    )
                c.execute(
                    "UPDATE generations SET state = 'retired' WHERE coll_id = ? AND state = "
                    "'previous'",
                    (coll.id,),
                )
                c.execute(
                    "UPDATE generations SET state = 'previous' WHERE coll_id = ? AND generation = "
                    "?",
                    (coll.id, old_gen),
                )
                c.execute(
                    "UPDATE generations SET state = 'active', built_kind = ?, params = ?, dim = ? "
                    "WHERE coll_id = ? AND generation = ?",
                    (kind.value, _params_json(rparams), dim, coll.id, gen),
                )
                c.execute(
                    "UPDATE collections SET generation = ?, index_type = ?, params = ?, embedder "
                    "= ?, dim = ? "
                    "WHERE id = ?",
                    (gen, target.value, _params_json(params), new_embedder, dim, coll.id),
                )
            with coll.rw.write():
                old = (coll.index, coll.indexed_seq)
                coll.index, coll.kind, coll.rparams = index, kind, rparams
                coll.generation, coll.index_type, coll.params = gen, target, params
                coll.embedder, coll.dim = new_embedder, dim
                coll._live_sel = None
        with coll.ckpt_lock:
            for g in retired:
                for _, p, _ in fx.checkpoint_files(coll.dir, g):
                    p.unlink(missing_ok=True)
        return old

    def rollback(self, tenant: str, name: str) -> CollectionInfo:
        """Make the previous generation active again (restoring re-embedded vectors).

        Items written after the rebuild keep their current vectors. Raises
        FailedPrecondition when there is no previous generation.
        """
        coll = self._get(tenant, name)
        if not coll.maint_lock.acquire(blocking=False):
            raise FailedPrecondition(
                f"a rebuild, rollback or compaction of {name!r} is already running; wait for it "
                "to finish"
            )
        try:
            conn = self._reader()
            row = conn.execute(
                "SELECT generation, index_type, requested, embedder, dim FROM generations "
                "WHERE coll_id = ? AND state = 'previous'",
                (coll.id,),
            ).fetchone()
            if row is None:
                raise FailedPrecondition(
                    f"collection {name!r} has no previous generation to roll back to"
                )
            prev, prev_type, prev_req, prev_emb, prev_dim = row
            with coll.write_mutex:
                cur = coll.generation
                with self._tx() as c:
                    c.execute(
                        "UPDATE items SET vector = (SELECT p.vector FROM prev_vectors p WHERE "
                        "p.coll_id = ? "
                        "AND p.generation = ? AND p.seq = items.seq) WHERE coll_id = ? AND seq IN "
                        "(SELECT seq FROM prev_vectors WHERE coll_id = ? AND generation = ?)",
                        (coll.id, prev, coll.id, coll.id, prev),
                    )
                    c.execute("DELETE FROM prev_vectors WHERE coll_id = ?", (coll.id,))
                    c.execute(
                        "UPDATE generations SET state = 'retired' WHERE coll_id = ? AND "
                        "generation = ?",
                        (coll.id, cur),
                    )
                    c.execute(
                        "UPDATE generations SET state = 'active' WHERE coll_id = ? AND generation "
                        "= ?",
                        (coll.id, prev),
                    )
                    c.execute(
                        "UPDATE collections SET generation = ?, index_type = ?, params = ?, "
                        "embedder = ?, dim = ? "
                        "WHERE id = ?",
                        (prev, prev_type, prev_req, prev_emb, prev_dim, coll.id),
                    )
                kind, rparams, _ = self._gen_row(conn, coll.id, prev)
                shadow = _Coll(
                    id=coll.id,
                    tenant=coll.tenant,
                    name=coll.name,
                    dim=prev_dim,
                    metric=coll.metric,
                    index_type=IndexType(prev_type),
                    embedder=prev_emb,
                    params=_params_from(prev_req),
                    generation=prev,
                    created_at=coll.created_at,
                    dir=coll.dir,
                )
                index = self._index_from_store(conn, shadow, prev, kind, rparams)
                with coll.rw.write():
                    coll.index, coll.kind, coll.rparams, coll.generation = (
                        index,
                        kind,
                        rparams,
                        prev,
                    )
                    coll.index_type, coll.params = shadow.index_type, shadow.params
                    coll.embedder, coll.dim = prev_emb, prev_dim
                    coll._live_sel = None
            with coll.ckpt_lock:
                for _, p, _ in fx.checkpoint_files(coll.dir, cur):
                    p.unlink(missing_ok=True)
            self._checkpoint(coll)
            return self._info(coll)
        finally:
            coll.maint_lock.release()

    # ------------------------------------------------------------------ compaction

    def compact(self, tenant: str, name: str | None = None) -> int:
        """Physically drop tombstoned rows (of one collection, or all of the tenant's) and
        rebuild the active index without them. Returns the number of rows removed."""
        self._check_open()
        if name is not None:
            colls = [self._get(tenant, name)]
        else:
            colls = [c for (t, _), c in list(self._colls.items()) if t == tenant and not c.dropped]
        removed = 0
        for coll in colls:
            if not coll.maint_lock.acquire(blocking=False):
                raise FailedPrecondition(
                    f"a rebuild, rollback or compaction of {coll.name!r} is already running; try "
                    "again later"
                )
            try:
                removed += self._compact(coll)
            finally:
                coll.maint_lock.release()
        return removed

    def _compact(self, coll: _Coll) -> int:
        conn = self._reader()
        with coll.write_mutex:
            with self._tx() as c:
                c.execute(
                    "DELETE FROM prev_vectors WHERE coll_id = ? AND seq IN "
                    "(SELECT seq FROM items WHERE coll_id = ? AND deleted = 1)",
                    (coll.id, coll.id),
                )
                removed = c.execute(
                    "DELETE FROM items WHERE coll_id = ? AND deleted = 1", (coll.id,)
                ).rowcount
            snap = coll.indexed_seq
            with coll.rw.read():
                stale = coll.index.ntotal > coll.live_count
                template = (
                    faiss.clone_index(coll.index)
                    if stale and coll.kind == IndexType.IVF_PQ
                    else None
                )
                kind, rparams, gen = coll.kind, coll.rparams, coll.generation
        if stale:
            if template is not None:  # keep the trained quantizer and codebooks
                template.reset()
                index = template
            else:
                index = fx.new_index(kind, coll.dim, coll.metric, rparams)
            for seqs, vecs in self._iter_vectors(conn, coll, 0, snap):
                index.add_with_ids(vecs, seqs)
            with coll.write_mutex:
                for seqs, vecs in self._iter_vectors(conn, coll, snap, None):
                    index.add_with_ids(vecs, seqs)
                with coll.rw.write():
                    if coll.generation == gen and not coll.dropped:
                        coll.index = index
                        coll._live_sel = None
            self._checkpoint(coll)
        return int(removed)

    # ------------------------------------------------------------------ snapshot / restore

    def snapshot(self, dest_dir: str | os.PathLike) -> int:
        """Write a consistent copy of the store and index checkpoints to `dest_dir` (which
        must be empty or absent). Writes may continue meanwhile. Returns bytes written."""
        self._check_open()
        dest = Path(dest_dir)
        if dest.exists() and not dest.is_dir():
            raise InvalidArgument(f"snapshot target {dest.name!r} is a file; name a directory")
        if dest.exists() and any(dest.iterdir()):
            raise InvalidArgument(f"snapshot directory {dest.name!r} is not empty; pick a new one")
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # read-only, permission denied, a file on the path
            raise FailedPrecondition(
                f"cannot create snapshot directory {dest.name!r}: {e.strerror}"
            ) from None
        total = 0
        # checkpoints first: each covers a seq the later database copy also covers, and seqs
        # are never reused, so a restored index never holds a vector the store lacks
        for coll in list(self._colls.values()):
            self._checkpoint(coll)
            with coll.ckpt_lock:
                if coll.dir.is_dir():
                    out = dest / "indexes" / coll.dir.name
                    out.mkdir(parents=True, exist_ok=True)
                    for p in coll.dir.iterdir():
                        if fx.parse_checkpoint_name(p.name):
                            shutil.copyfile(p, out / p.name)
                            total += self._fsync_file(out / p.name)
        # one backup step on a reader connection copies a single WAL snapshot of the
        # database without holding the writer lock, so upserts continue meanwhile
        source, target = connect(self._db_path), sqlite3.connect(dest / DB_NAME)
        try:
            source.backup(target, pages=-1)
        finally:
            target.close()
            source.close()
        total += self._fsync_file(dest / DB_NAME)
        fx.fsync_dir(dest)
        return total

    @staticmethod
    def _fsync_file(path: Path) -> int:
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
            return os.fstat(f.fileno()).st_size

    @staticmethod
    def restore(snapshot_dir: str | os.PathLike, data_dir: str | os.PathLike) -> None:
        """Replace `data_dir`'s contents with a snapshot. No Engine may have it open."""
        src, dst = Path(snapshot_dir), Path(data_dir)
        if not (src / DB_NAME).is_file():
            raise InvalidArgument(f"{src.name!r} is not a snapshot: it has no {DB_NAME}")
        dst.mkdir(parents=True, exist_ok=True)
        with open(dst / "LOCK", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise FailedPrecondition(
                    f"data directory {dst.name!r} is in use by a running Engine; stop it before "
                    "restoring"
                ) from None
            try:
                for suffix in ("", "-wal", "-shm"):
                    (dst / (DB_NAME + suffix)).unlink(missing_ok=True)
                shutil.rmtree(dst / "indexes", ignore_errors=True)
                if (src / "indexes").is_dir():
                    shutil.copytree(src / "indexes", dst / "indexes")
                tmp = dst / (DB_NAME + ".restoring")
                shutil.copyfile(src / DB_NAME, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dst / DB_NAME)
                fx.fsync_dir(dst)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


__all__ = ["Engine", "RebuildProgress", "MAX_TOP_K"]
