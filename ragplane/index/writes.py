"""Upserts and deletes: one SQLite transaction (items and their lexical index), then the FAISS
index and the live set."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from ragplane.core import cpus
from ragplane.core.errors import InvalidArgument, NotFound
from ragplane.index import repository as repo
from ragplane.index.checkpoints import checkpoint_or_log
from ragplane.index.context import Context
from ragplane.index.filters import compile_filter
from ragplane.index.state import Coll
from ragplane.index.types import Filter, IndexType, Record
from ragplane.index.validate import check_ids, record_row_groups, record_vectors

# HNSW inserts are slow (~1 ms each); adding a large batch in chunks lets searches on the
# collection run between chunks instead of waiting for the whole batch.
HNSW_ADD_CHUNK = 32


def upsert(ctx: Context, tenant: str, name: str, records: Sequence[Record]) -> int:
    """Insert or replace `records` (each with a vector, or with chunks) in one transaction:
    an item and all of its chunks are written together or not at all.

    Returns the number of items written. Replacing an id tombstones every row of
    its previous version.
    """
    with StagedUpsert(ctx, tenant, name, records).written():
        pass
    return len(records)


class StagedUpsert:
    """An upsert into a collection found when made, its items checked by `check` (every
    record has a vector of the collection's dimension, or chunks; ids once each) and
    written by `with staged.written():`, which checks them first if `check` was not called.
    The block runs with the rows in the open transaction, which commits (and the indexes
    follow) when the block ends, or rolls back when it raises: a cache of another store
    (PostgreSQL) commits the truth there, so that it commits only once the truth has, and
    checks and writes the items while the truth runs its statements."""

    def __init__(self, ctx: Context, tenant: str, name: str, records: Sequence[Record]) -> None:
        self.ctx = ctx
        self.coll = ctx.get(tenant, name)
        self.records = records
        self.checked: tuple[list[repo.Row], list[Record], np.ndarray] | None = None

    @property
    def dim(self) -> int:
        return self.coll.dim

    def all_new(self) -> bool:
        """Whether the ids are distinct and none is stored here yet."""
        ids = [r.id for r in self.records]
        return len(set(ids)) == len(ids) and not repo.live_among(
            self.ctx.reader(), self.coll.id, ids
        )

    def check(self) -> None:
        """InvalidArgument naming the first item the collection cannot take."""
        coll = self.coll
        rows, vec_records = record_row_groups(self.records, coll.chunking.enabled)
        mat = record_vectors(vec_records, coll.dim, coll.metric, coll.name)
        self.checked = rows, vec_records, mat

    @contextmanager
    def written(self) -> Iterator[None]:
        if self.checked is None:
            self.check()
        assert self.checked is not None
        coll = self.coll
        rows, vec_records, mat = self.checked
        with coll.write_mutex:
            if coll.dropped:
                raise NotFound(f"collection {coll.name!r} was deleted")
            if mat.shape[1] != coll.dim:  # the collection was re-embedded to another dim
                mat = record_vectors(vec_records, coll.dim, coll.metric, coll.name)
            with self.ctx.tx() as c:
                old, seqs = repo.replace_items(c, coll.id, rows, mat, coll.lexical)
                yield
            tail = np.fromiter((r[1] > 0 for r in rows), dtype=bool, count=len(rows))
            _index(coll, mat, seqs, [r[0] for r in rows], old, tail)
            with coll.rw.write():
                coll.writes_since_ckpt += len(rows)
                due = coll.writes_since_ckpt >= self.ctx.checkpoint_every
        if due:
            checkpoint_or_log(coll)


def _index(
    coll: Coll, mat: np.ndarray, seqs: np.ndarray, ids: list[str], old: list[int],
    tail: np.ndarray,
) -> None:
    """Add committed rows to FAISS and the live set (`tail`: the rows that are chunks past
    their item's first). Called under write_mutex."""
    n = len(ids)
    chunk = HNSW_ADD_CHUNK if coll.built_type == IndexType.HNSW else n
    with coll.rw.write():
        coll.mark_dead(old)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        with coll.rw.write(), cpus.wide():  # FAISS's add needs no GIL: any core
            coll.index.add_with_ids(mat[lo:hi], seqs[lo:hi])
            coll.mark_live(seqs[lo:hi], ids[lo:hi], seqs[lo:hi][tail[lo:hi]].tolist())
            coll.indexed_seq = int(seqs[hi - 1])


def check_delete(
    ids: Sequence[str] | None, filter: Filter | None
) -> tuple[list[str] | None, Filter | None]:
    """A delete's selector, as both stores check it: exactly one of ids or a non-empty
    filter, returned as (ids, filter) with the other None."""
    if (ids is None) == (filter is None):
        raise InvalidArgument("pass either ids or a filter to delete")
    if filter is not None and filter.is_empty():
        raise InvalidArgument(
            "an empty filter would delete everything; delete the collection instead"
        )
    return (check_ids(ids) if ids is not None else None), filter


def delete(
    ctx: Context,
    tenant: str,
    name: str,
    ids: Sequence[str] | None,
    filter: Filter | None,
) -> int:
    """Tombstone items by ids or by filter (exactly one). Returns how many were deleted."""
    coll = ctx.get(tenant, name)
    wanted, matching = check_delete(ids, filter)
    if wanted is not None:
        where, args = "item_id IN (SELECT value FROM json_each(?))", [json.dumps(wanted)]
    else:
        where, args = compile_filter(matching)
    with coll.write_mutex:
        if coll.dropped:
            raise NotFound(f"collection {name!r} was deleted")
        with ctx.tx() as c:
            gone, items = repo.tombstone(c, coll.id, where, args, ids is not None, coll.lexical)
        with coll.rw.write():
            coll.mark_dead(gone)
            coll.writes_since_ckpt += len(gone)
    return items
