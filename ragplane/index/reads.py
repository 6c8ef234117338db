"""Reads by id, in write order, and the filter lookups searches share (with their cache)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ragplane.core.errors import InvalidArgument
from ragplane.index import repository as repo
from ragplane.index.context import Context
from ragplane.index.filters import compile_filter, field_path
from ragplane.index.state import Coll
from ragplane.index.types import Filter, Record
from ragplane.index.validate import check_ids

FILTER_CACHE_SIZE = 64


def get(
    ctx: Context, tenant: str, name: str, ids: Sequence[str], include_vectors: bool
) -> list[Record]:
    """Live records for `ids`, in request order; ids that do not exist are left out."""
    coll = ctx.get(tenant, name)
    ids = check_ids(ids)
    if not ids:
        return []
    by_id = {r[0]: r for r in repo.items_by_id(ctx.reader(), coll.id, ids, include_vectors)}
    out, seen = [], set()
    for i in ids:
        r = by_id.get(i)
        if r is None or i in seen:
            continue
        seen.add(i)
        vec = np.frombuffer(r[3], dtype=np.float32).copy() if include_vectors else None
        out.append(Record(id=i, vector=vec, text=r[1], metadata=json.loads(r[2])))
    return out


def live_among(ctx: Context, tenant: str, name: str, ids: Sequence[str]) -> set[str]:
    """Those of `ids` that are live items of the collection."""
    return repo.live_among(ctx.reader(), ctx.get(tenant, name).id, ids)


def iter_records(ctx: Context, tenant: str, name: str, batch: int) -> Iterator[list[Record]]:
    """Live records with vectors in a stable (write) order, `batch` at a time."""
    coll = ctx.get(tenant, name)
    if batch <= 0:
        raise InvalidArgument("batch must be positive")
    last = 0
    while True:
        rows = repo.items_page(ctx.reader(), coll.id, last, batch)
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


def page(
    ctx: Context, tenant: str, name: str, order_by: str, after: tuple[Any, str] | None,
    limit: int, filter: Filter | None,
) -> list[Record]:
    """See `Engine.page`."""
    coll = ctx.get(tenant, name)
    if limit <= 0:
        raise InvalidArgument("limit must be positive")
    where, args = compile_filter(filter)
    rows = repo.page_by(ctx.reader(), coll.id, field_path(order_by), after, limit, where, args)
    return [Record(id=r[0], vector=None, text=r[1], metadata=json.loads(r[2])) for r in rows]


def count_matching(ctx: Context, tenant: str, name: str, filter: Filter | None) -> int:
    """How many live items match `filter` (all live items when None or empty)."""
    coll = ctx.get(tenant, name)
    if filter is None or filter.is_empty():
        compile_filter(filter)
        return coll.item_count
    found = matching(ctx, coll, filter)
    with coll.rw.read():
        live = found[coll.live.contains(found)]
        if coll.tails:  # every chunk of a matching item matches: count each item once
            return sum(1 for s in live.tolist() if s not in coll.tails)
        return int(live.size)


def ids_matching(ctx: Context, tenant: str, name: str, filter: Filter) -> list[str]:
    """The ids of the live items matching `filter` (a delete by filter, said as ids)."""
    coll = ctx.get(tenant, name)
    found = matching(ctx, coll, filter)
    with coll.rw.read():
        live = found[coll.live.contains(found)]
        return sorted({coll.seq_to_id[s] for s in live.tolist() if s in coll.seq_to_id})


def matching(ctx: Context, coll: Coll, flt: Filter) -> np.ndarray:
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
    found = repo.matching_seqs(ctx.reader(), coll.id, where, args)
    found.setflags(write=False)
    with coll.cache_lock:
        coll.filter_cache[key] = (version, found)
        coll.filter_cache.move_to_end(key)
        while len(coll.filter_cache) > FILTER_CACHE_SIZE:
            coll.filter_cache.popitem(last=False)
    return found
