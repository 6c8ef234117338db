"""The durable vector engine: SQLite as the source of truth, FAISS per collection.

`Engine` is a thin facade: each method opens the collection and hands it to the module
that owns the job (see ARCHITECTURE.md). The engine is called from many gRPC threads at
once; the locks and their order are described in `ragplane.index.state`.

Durability: a write returns after its SQLite transaction commits. FAISS indexes are
derived from the store (`ragplane.index.checkpoints`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragplane.core.sqlite import check_integrity
from ragplane.core.storage import OPEN, storage_errors
from ragplane.index import (
    catalog,
    checkpoints,
    generations,
    hybrid,
    reads,
    rebuild,
    search,
    snapshots,
    writes,
)
from ragplane.index.context import Context, data_dir_lock
from ragplane.index.gpu import GpuCopies, faiss_gpu_available
from ragplane.index.progress import RebuildProgress
from ragplane.index.state import Coll
from ragplane.index.store import init_schema
from ragplane.index.types import (
    Chunking,
    CollectionInfo,
    Filter,
    Fusion,
    IndexParams,
    IndexType,
    Kind,
    Metric,
    Record,
    SearchKnobs,
    SearchResult,
)
from ragplane.index.validate import MAX_TOP_K

log = logging.getLogger(__name__)


class Engine:
    """Durable collections of vectors with metadata, searchable through FAISS.

    Thread-safe. Open one Engine per data directory (a lock file enforces it).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        checkpoint_every: int = 50_000,
        use_gpu: bool = False,
        integrity_check: str = "quick",
        durable: bool = True,
    ) -> None:
        """Open (or create) the store in `data_dir`. `integrity_check` ("quick", "full" or
        "off") is what SQLite checks before anything is served: a damaged store raises
        Corrupt, naming the file and the way back. Not `durable`: a cache of a store
        that lives elsewhere, whose commits are not synced to disk (they survive a crash of
        the process, not always one of the machine: its owner rebuilds it then)."""
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "indexes").mkdir(exist_ok=True)
        self._use_gpu = bool(use_gpu) and faiss_gpu_available()
        gpu = GpuCopies() if self._use_gpu else None
        with contextlib.ExitStack() as stack, storage_errors(path, OPEN):
            busy = f"data directory {path.name!r} is in use by another Engine; stop it first"
            stack.enter_context(data_dir_lock(path, busy))
            self._ctx = Context(path, checkpoint_every, gpu, durable)
            stack.callback(self._ctx.close)
            if integrity_check != "off":
                check_integrity(self._ctx.writer, self._ctx.db_path, integrity_check == "full")
            init_schema(self._ctx.writer)
            checkpoints.recover(self._ctx)
            self._held = stack.pop_all()  # released by close()

    @property
    def db_path(self) -> Path:
        return self._ctx.db_path

    @property
    def _colls(self) -> dict[tuple[str, str], Coll]:
        """The open collections of this kind (white-box tests read their FAISS indexes)."""
        return {(c.tenant, c.name): c for c in self._ctx.live()}

    def of_kind(self, kind: Kind) -> Engine:
        """This engine, seeing the collections of `kind` (the default is Kind.COLLECTION):
        names of different kinds never collide. A view: close the Engine, not it."""
        view = copy.copy(self)
        view._ctx = self._ctx.of_kind(kind)
        return view

    # ------------------------------------------------------------------ lifecycle

    def checkpoint(self) -> None:
        """Checkpoint every collection's index now."""
        self._ctx.check_open()
        with storage_errors(self._ctx.dir):
            for coll in self._ctx.all():
                checkpoints.checkpoint(coll)

    def close(self) -> None:
        """Checkpoint all indexes and close the store. Idempotent."""
        if self._ctx.closed:
            return
        try:
            for coll in self._ctx.all():
                try:
                    checkpoints.checkpoint(coll)
                except Exception:  # a failed checkpoint only costs catch-up time at next open
                    log.exception("checkpoint of %s/%s failed at close", coll.tenant, coll.name)
        finally:
            self._held.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def run_once(self, name: str) -> Iterator[bool]:
        """Work that must run once among the servers of a store (a sweep): yields whether
        this one runs it. One embedded store has one server: always."""
        yield True

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
        lexical_index: bool = True,
        chunking: Chunking = Chunking(),  # noqa: B008 - frozen
    ) -> CollectionInfo:
        """Create an empty collection, with a lexical (FTS5) index of its item text unless
        `lexical_index` is False; `chunking` is recorded for the server, which splits by it.
        Raises AlreadyExists if (tenant, name) is taken."""
        return catalog.create(
            self._ctx, tenant, name, dim, metric, index_type, embedder, params, lexical_index,
            chunking,
        )

    def delete_collection(self, tenant: str, name: str) -> None:
        catalog.delete(self._ctx, tenant, name)

    def list_collections(self, tenant: str) -> list[CollectionInfo]:
        self._ctx.check_open()
        return [catalog.info(c) for c in self._ctx.live(tenant)]

    def list_all_collections(self) -> list[CollectionInfo]:
        """Every collection of every tenant (for sweepers and admin status)."""
        self._ctx.check_open()
        return [catalog.info(c) for c in self._ctx.live()]

    def describe(self, tenant: str, name: str) -> CollectionInfo:
        return catalog.info(self._ctx.get(tenant, name))

    def scan_size(self, tenant: str, name: str) -> int:
        """How many vectors an exact scan of the collection reads: its live ones and the
        replaced or deleted ones its index still holds (`describe`'s chunks + tombstones,
        without building the whole description: searches ask it every call)."""
        coll = self._ctx.get(tenant, name)
        return max(coll.live_count, int(coll.index.ntotal))

    def set_embedder(self, tenant: str, name: str, embedder: str) -> None:
        """Record that the collection's vectors come from `embedder` (name@version)."""
        catalog.set_embedder(self._ctx, tenant, name, embedder)

    # ------------------------------------------------------------------ writes

    def upsert(self, tenant: str, name: str, records: Sequence[Record]) -> int:
        """Insert or replace `records` (each with a vector) in one transaction.

        Returns the number written. Replacing an id tombstones its previous vector.
        """
        return writes.upsert(self._ctx, tenant, name, records)

    def stage_upsert(
        self, tenant: str, name: str, records: Sequence[Record]
    ) -> writes.StagedUpsert:
        """An upsert into the collection as this store has it now: its items checked by
        `staged.check()`, written by `with staged.written():`, whose block runs with the
        rows in the open transaction. For a cache that checks and writes while the store it
        caches runs the same write, and commits only after that store did
        (`ragplane.index.pg.upsert`)."""
        return writes.StagedUpsert(self._ctx, tenant, name, records)

    def delete(
        self,
        tenant: str,
        name: str,
        *,
        ids: Sequence[str] | None = None,
        filter: Filter | None = None,
    ) -> int:
        """Tombstone items by ids or by filter (exactly one). Returns how many were deleted."""
        return writes.delete(self._ctx, tenant, name, ids, filter)

    # ------------------------------------------------------------------ reads

    def get(
        self, tenant: str, name: str, ids: Sequence[str], *, include_vectors: bool = False
    ) -> list[Record]:
        """Live records for `ids`, in request order; ids that do not exist are left out."""
        return reads.get(self._ctx, tenant, name, ids, include_vectors)

    def live_among(self, tenant: str, name: str, ids: Sequence[str]) -> set[str]:
        """Those of `ids` that exist in the collection."""
        return reads.live_among(self._ctx, tenant, name, ids)

    def iter_records(self, tenant: str, name: str, batch: int = 1024) -> Iterator[list[Record]]:
        """Live records with vectors in a stable (write) order, `batch` at a time."""
        return reads.iter_records(self._ctx, tenant, name, batch)

    def page(
        self,
        tenant: str,
        name: str,
        *,
        order_by: str,
        after: tuple[Any, str] | None = None,
        limit: int,
        filter: Filter | None = None,
    ) -> list[Record]:
        """Up to `limit` live records matching `filter` (without vectors), ordered by the
        metadata field `order_by` (dotted), then id; `after` is the (value, id) of the last
        record of the previous page. Paged in SQL: a page costs its own size."""
        return reads.page(self._ctx, tenant, name, order_by, after, limit, filter)

    def ids_matching(self, tenant: str, name: str, filter: Filter) -> list[str]:
        """The ids of the live items matching `filter`, sorted."""
        return reads.ids_matching(self._ctx, tenant, name, filter)

    def count_matching(self, tenant: str, name: str, filter: Filter | None) -> int:
        """How many live items match `filter` (all live items when None or empty)."""
        return reads.count_matching(self._ctx, tenant, name, filter)

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
        chunks_per_hit: int = 1,
        knobs: SearchKnobs | None = None,
    ) -> list[SearchResult]:
        """Nearest live items to each row of `queries` ([n, dim] or [dim]), best first; an
        item split into chunks ranks by its best chunk and its hit carries its best
        `chunks_per_hit` chunks (`Hit.chunks`, offsets into its text). `knobs`: this
        search's parameters (ef_search, nprobe, exact, oversampling); None = the
        collection's defaults; one that does not apply to its index is InvalidArgument.

        One FAISS call serves all rows. Scores are higher-is-better for every metric
        (l2: negative squared distance). With a filter, results fill `top_k` whenever that
        many live items match; `exhaustive` says whether the result is exact.
        """
        return search.search(
            self._ctx, tenant, name, queries, top_k, filter, include_text, include_metadata,
            chunks_per_hit, knobs=knobs,
        )

    def search_lexical(
        self,
        tenant: str,
        name: str,
        text: str,
        top_k: int,
        *,
        filter: Filter | None = None,
        include_text: bool = False,
        include_metadata: bool = False,
        chunks_per_hit: int = 1,
    ) -> SearchResult:
        """The live items best matching the words of `text` by BM25, best first (exact).
        FailedPrecondition when the collection has no lexical index."""
        return hybrid.search_lexical(
            self._ctx, tenant, name, text, top_k, filter, include_text, include_metadata,
            chunks_per_hit,
        )

    def search_hybrid(
        self,
        tenant: str,
        name: str,
        text: str,
        vector: np.ndarray,
        top_k: int,
        *,
        fusion: Fusion = Fusion(),  # noqa: B008 - frozen
        filter: Filter | None = None,
        include_text: bool = False,
        include_metadata: bool = False,
        chunks_per_hit: int = 1,
    ) -> SearchResult:
        """The dense ranking of `vector` (the embedding of `text`) and the lexical ranking
        of `text`, fused per chunk, then per item; each hit carries its dense, lexical and
        fused scores (its best chunk's)."""
        return hybrid.search_hybrid(
            self._ctx, tenant, name, text, vector, top_k, fusion, filter, include_text,
            include_metadata, chunks_per_hit,
        )

    # ------------------------------------------------------------------ generations

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
        vectors replace the stored ones at the swap; the old ones are kept for rollback);
        one with a `stream` method (`rebuild.BulkReembed`) is handed every batch at once.
        Raises FailedPrecondition, after a "refused" progress report, when the new
        generation's recall@10 against exact search is below `min_recall`; the old
        generation keeps serving. Blocking: call it from a worker thread.
        """
        return rebuild.rebuild(
            self._ctx,
            tenant,
            name,
            index_type=index_type,
            params=params,
            reembed=reembed,
            embedder=embedder,
            min_recall=min_recall,
            progress=progress,
        )

    def rollback(self, tenant: str, name: str) -> CollectionInfo:
        """Make the previous generation active again (restoring re-embedded vectors).

        Items written after the rebuild keep their current vectors. Raises
        FailedPrecondition when there is no previous generation.
        """
        return generations.rollback(self._ctx, tenant, name)

    def compact(self, tenant: str, name: str | None = None) -> int:
        """Physically drop tombstoned rows (of one collection, or all of the tenant's) and
        rebuild the active index without them. Returns the number of rows removed."""
        return generations.compact(self._ctx, tenant, name)

    # ------------------------------------------------------------------ snapshot / restore

    def snapshot(
        self, dest_dir: str | os.PathLike[str], also: Callable[[Path], int] | None = None
    ) -> int:
        """Write a consistent copy of the store and index checkpoints to `dest_dir` (which
        must be empty or absent), then what `also` writes there (returning its bytes).
        Writes may continue meanwhile. Returns bytes written. A full or read-only
        destination raises StorageFull / StorageReadOnly; a failed snapshot is removed."""
        return snapshots.snapshot(self._ctx, dest_dir, also)

    @staticmethod
    def restore(snapshot_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str]) -> None:
        """Replace `data_dir`'s contents with a snapshot. No Engine may have it open."""
        snapshots.restore(snapshot_dir, data_dir)


__all__ = ["Engine", "RebuildProgress", "MAX_TOP_K", "faiss_gpu_available"]
