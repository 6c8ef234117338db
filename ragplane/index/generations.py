"""Maintenance of a collection's generations besides rebuilds: rollback and compaction."""

from __future__ import annotations

import faiss

from ragplane.core import cpus
from ragplane.core.errors import FailedPrecondition
from ragplane.index import faiss_index as fx
from ragplane.index import repository as repo
from ragplane.index.catalog import info
from ragplane.index.checkpoints import checkpoint, index_from_store, remove_generation_files
from ragplane.index.context import Context
from ragplane.index.state import Coll, params_from
from ragplane.index.types import CollectionInfo, IndexType


def rollback(ctx: Context, tenant: str, name: str) -> CollectionInfo:
    """Make the previous generation active again (restoring re-embedded vectors).

    Items written after the rebuild keep their current vectors. Raises
    FailedPrecondition when there is no previous generation.
    """
    coll = ctx.get(tenant, name)
    with coll.maintenance():
        conn = ctx.reader()
        prev = repo.previous_generation(conn, coll.id)
        if prev is None:
            raise FailedPrecondition(
                f"collection {name!r} has no previous generation to roll back to"
            )
        gen, prev_type, prev_req, prev_emb, prev_dim = prev
        with coll.write_mutex:
            cur = coll.generation
            with ctx.tx() as c:
                repo.roll_back(c, coll.id, cur, prev)
            built_type, rparams = repo.generation_build(conn, coll.id, gen)
            shadow = Coll(
                id=coll.id,
                tenant=coll.tenant,
                name=coll.name,
                dim=prev_dim,
                metric=coll.metric,
                index_type=IndexType(prev_type),
                embedder=prev_emb,
                params=params_from(prev_req),
                generation=gen,
                created_at=coll.created_at,
                dir=coll.dir,
            )
            index = index_from_store(conn, shadow, gen, built_type, rparams)
            with coll.rw.write():
                coll.index, coll.built_type = index, built_type
                coll.rparams, coll.generation = rparams, gen
                coll.index_type, coll.params = shadow.index_type, shadow.params
                coll.embedder, coll.dim = prev_emb, prev_dim
                coll._live_sel = None
        remove_generation_files(coll, cur)
        checkpoint(coll)
        return info(coll)


def compact(ctx: Context, tenant: str, name: str | None) -> int:
    """Physically drop tombstoned rows (of one collection, or all of the tenant's) and
    rebuild the active index without them. Returns the number of rows removed."""
    ctx.check_open()
    colls = [ctx.get(tenant, name)] if name is not None else ctx.live(tenant)
    removed = 0
    for coll in colls:
        with coll.maintenance():
            removed += _compact(ctx, coll)
    return removed


def _compact(ctx: Context, coll: Coll) -> int:
    conn = ctx.reader()
    with coll.write_mutex:
        with ctx.tx() as c:
            removed = repo.purge_deleted(c, coll.id)
        snap = coll.indexed_seq
        with coll.rw.read():
            stale = coll.index.ntotal > coll.live_count
            template = (
                faiss.clone_index(coll.index)
                if stale and fx.needs_training(coll.built_type, coll.rparams) else None
            )
            built_type, rparams, gen = coll.built_type, coll.rparams, coll.generation
    if not stale:
        return removed
    if template is not None:  # keep the trained quantizer and codebooks
        template.reset()
        index = template
    else:
        index = fx.new_index(built_type, coll.dim, coll.metric, rparams)
    with cpus.wide():  # FAISS's adds need no GIL: any core (ragplane.core.cpus)
        for seqs, vecs in repo.iter_vectors(conn, coll.id, coll.dim, 0, snap):
            index.add_with_ids(vecs, seqs)
    with coll.write_mutex:
        for seqs, vecs in repo.iter_vectors(conn, coll.id, coll.dim, snap, None):
            index.add_with_ids(vecs, seqs)
        with coll.rw.write():
            if coll.generation == gen and not coll.dropped:
                coll.index = index
                coll._live_sel = None
    checkpoint(coll)
    return removed
