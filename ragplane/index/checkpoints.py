"""Opening a data directory: recovery, loading FAISS checkpoints and catching them up.

FAISS indexes are derived from the store: checkpointed to ``indexes/<collection id>/`` and,
on open, loaded and caught up from rows newer than the checkpoint, or rebuilt from the store
when no checkpoint loads.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from typing import Any

from ragplane.core.storage import storage_error
from ragplane.index import faiss_index as fx
from ragplane.index import repository as repo
from ragplane.index.context import Context
from ragplane.index.state import Coll, chunking_from, params_from
from ragplane.index.types import IndexParams, IndexType, Kind, Metric

log = logging.getLogger(__name__)


def recover(ctx: Context) -> None:
    """Fail interrupted rebuilds, load every collection and drop orphaned index files."""
    with ctx.tx() as c:
        repo.fail_unfinished_builds(c)
    keep_dirs = set()
    for row in repo.collection_rows(ctx.writer):
        coll = Coll(
            id=row[0],
            tenant=row[1],
            name=row[2],
            dim=row[3],
            metric=Metric(row[4]),
            index_type=IndexType(row[5]),
            embedder=row[6],
            params=params_from(row[7]),
            generation=row[8],
            created_at=row[9],
            dir=ctx.idx_dir / str(row[0]),
            purpose=Kind(row[10]),
            lexical=bool(row[11]),
            chunking=chunking_from(row[12]),
        )
        keep_dirs.add(coll.dir.name)
        _clean_generation_files(ctx, coll)
        load_active(ctx, coll)
        ctx.register(coll)
    for p in ctx.idx_dir.iterdir():
        if p.name not in keep_dirs:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _clean_generation_files(ctx: Context, coll: Coll) -> None:
    keep = repo.kept_generations(ctx.writer, coll.id)
    if not coll.dir.is_dir():
        return
    for p in coll.dir.iterdir():
        parsed = fx.parse_checkpoint_name(p.name)
        if parsed is None or parsed[0] not in keep:
            p.unlink(missing_ok=True)


def load_active(ctx: Context, coll: Coll) -> None:
    """Load the active generation's index from its checkpoint and catch up from the
    store (or build it from the store), and the live-set bookkeeping."""
    conn = ctx.writer
    built_type, rparams = repo.generation_build(conn, coll.id, coll.generation)
    coll.built_type, coll.rparams = built_type, rparams
    coll.index = index_from_store(conn, coll, coll.generation, built_type, rparams)
    seqs, ids, tails, top = repo.live_ids(conn, coll.id)
    coll.live = fx.LiveBits(int(seqs.max()) + 1 if seqs.size else 1024)
    coll.live_count = 0
    coll.seq_to_id = {}
    coll.tails = set()
    coll.mark_live(seqs, ids, tails)
    coll.indexed_seq = top


def index_from_store(
    conn: sqlite3.Connection, coll: Coll, generation: int, built_type: IndexType,
    rparams: IndexParams,
) -> Any:
    """The generation's FAISS index: its checkpoint caught up with newer rows, or (when no
    checkpoint matches) built again from the store."""
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
        if fx.needs_training(built_type, rparams):  # no usable checkpoint: train again on the store
            _, vecs = repo.read_vectors(conn, coll.id, coll.dim, 0, None)
            index = fx.new_index(built_type, coll.dim, coll.metric, rparams, len(vecs))
            index.train(vecs)
        else:
            index = fx.new_index(built_type, coll.dim, coll.metric, rparams)
    for seqs, vecs in repo.iter_vectors(conn, coll.id, coll.dim, after, None):
        index.add_with_ids(vecs, seqs)
    return index


def checkpoint(coll: Coll) -> None:
    """Write the collection's index to disk, covering every row indexed so far.

    The write count it covers is cleared only once the file is durable, so a checkpoint
    that fails (a full disk) is tried again at the next write that makes one due."""
    with coll.ckpt_lock:
        with coll.rw.read():
            if coll.dropped:
                return
            staged = fx.stage_checkpoint(coll.dir, coll.index)
            seq, gen = coll.indexed_seq, coll.generation
            covered = coll.writes_since_ckpt
        fx.commit_checkpoint(coll.dir, gen, seq, staged)
        with coll.rw.write():
            coll.writes_since_ckpt = max(0, coll.writes_since_ckpt - covered)


def checkpoint_or_log(coll: Coll) -> bool:
    """`checkpoint`, for the write path: a checkpoint is derived data (the store holds every
    acknowledged row), so its failure is logged and never fails the write that made it
    due. Returns whether it was written."""
    try:
        checkpoint(coll)
        return True
    except Exception as exc:
        data_dir = coll.dir.parents[1]  # <data dir>/indexes/<collection id>
        fault = storage_error(exc, data_dir) or storage_error(exc.__context__, data_dir)
        if fault is None:
            log.exception("checkpoint of %s/%s failed", coll.tenant, coll.name)
        else:
            log.warning(
                "checkpoint of %s/%s failed, retried at the next due write: %s",
                coll.tenant,
                coll.name,
                fault,
            )
        return False


def remove_generation_files(coll: Coll, generation: int) -> None:
    with coll.ckpt_lock:  # delete_collection removes the directory under this lock
        for _, p, _ in fx.checkpoint_files(coll.dir, generation):
            p.unlink(missing_ok=True)
