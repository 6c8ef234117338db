"""Rebuilds: build a new index generation from the store beside the serving one, check its
recall, then catch it up and swap it in atomically.

Searches and upserts keep working meanwhile. With `reembed`, every item's text is
re-embedded: the new vectors are staged in SQLite and replace the stored ones at the swap
(the old ones are kept for rollback).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ragplane.core.errors import FailedPrecondition, InvalidArgument, NotFound
from ragplane.index import faiss_index as fx
from ragplane.index import repository as repo
from ragplane.index.catalog import info
from ragplane.index.checkpoints import checkpoint, remove_generation_files
from ragplane.index.context import Context
from ragplane.index.progress import ProgressEmitter, RebuildProgress
from ragplane.index.recall import RECALL_K, SearchFn, held_out, recall_at_k
from ragplane.index.rescore import rescore
from ragplane.index.state import Coll
from ragplane.index.types import CollectionInfo, IndexParams, IndexType, Metric
from ragplane.index.validate import check_min_recall, check_params, embedded_vectors, to_enum

log = logging.getLogger(__name__)

ADD_BATCH = 4096
REEMBED_BATCH = 256
Reembed = Callable[[list[str]], np.ndarray]  # or a BulkReembed


class BulkReembed(Protocol):
    """A re-embedder that takes a whole rebuild's texts at once (to spread them over a
    cluster, say). `stream(batches)` yields one vector array per batch, in order; the few
    rows written during the build are caught up through `__call__`. `where` says where it
    runs, for the progress reports. A plain `Reembed` is called batch by batch."""

    where: str

    def __call__(self, texts: list[str]) -> np.ndarray: ...

    def stream(self, batches: Iterable[list[str]]) -> Iterator[np.ndarray]: ...


@dataclass(frozen=True)
class Plan:
    """What a rebuild was asked for, validated."""

    target: IndexType
    params: IndexParams  # as requested
    reembed: Reembed | None
    embedder: str
    min_recall: float


@dataclass
class Built:
    """A new generation's index, built and checked but not yet serving."""

    gen: int
    snap: int  # every row up to this seq is in `index`
    index: Any
    built_type: IndexType
    rparams: IndexParams
    dim: int
    seqs: np.ndarray  # what was indexed, for the recall check
    vecs: np.ndarray
    held: np.ndarray  # mask of rows kept out of `index` until its recall is checked

    @property
    def n(self) -> int:
        return int(self.seqs.size)


def rebuild(
    ctx: Context, tenant: str, name: str, *, index_type: IndexType | None,
    params: IndexParams | None, reembed: Reembed | None, embedder: str | None,
    min_recall: float, progress: Callable[[RebuildProgress], None] | None,
) -> CollectionInfo:
    """See `Engine.rebuild`."""
    coll = ctx.get(tenant, name)
    target = (
        to_enum(IndexType, index_type, "index_type") if index_type is not None else coll.index_type
    )
    if params is None:
        params = coll.params if target == coll.index_type else IndexParams()
    params = check_params(target, coll.dim, params)
    min_recall = check_min_recall(min_recall)
    new_embedder = embedder if embedder is not None else coll.embedder
    if new_embedder != coll.embedder and reembed is None:
        raise InvalidArgument(
            "changing the embedder needs reembed: the stored vectors come from the old one"
        )
    with coll.maintenance():
        plan = Plan(target, params, reembed, new_embedder, min_recall)
        return _rebuild(ctx, coll, plan, progress)


def _rebuild(
    ctx: Context, coll: Coll, plan: Plan, progress_cb: Callable[[RebuildProgress], None] | None
) -> CollectionInfo:
    with coll.write_mutex:
        snap = coll.indexed_seq
        old_gen = coll.generation
        with ctx.tx() as c:
            gen = repo.begin_generation(
                c, coll.id, plan.target, plan.params, plan.embedder, coll.dim
            )
    prog = ProgressEmitter(progress_cb, gen)
    try:
        built = _build(ctx, coll, plan, gen, snap, prog)
        _check_recall(coll, plan, built, old_gen, prog)
        # durable before the swap, so a crash right after it loads this and catches up;
        # under ckpt_lock, which delete_collection holds to remove the directory
        with coll.ckpt_lock:
            if coll.dropped:
                raise NotFound(f"collection {coll.name!r} was deleted during the rebuild")
            fx.write_checkpoint(coll.dir, gen, snap, built.index)
        old_index, old_seq = _swap(ctx, coll, plan, built)
    except BaseException:
        _abandon(ctx, coll, gen)
        raise
    # keep the old generation loadable for rollback without a full rebuild
    try:
        with coll.ckpt_lock:
            if not coll.dropped:
                fx.write_checkpoint(coll.dir, old_gen, old_seq, old_index)
    except Exception:
        log.exception("could not checkpoint previous generation %d of %s", old_gen, coll.name)
    checkpoint(coll)
    prog.start("swapped", built.n)
    prog.emit(built.n, f"generation {gen} is serving; generation {old_gen} is kept for rollback")
    return info(coll)


def _embed(reembed: Reembed, texts: list[str], metric: Metric) -> np.ndarray:
    try:
        out = reembed(texts)
    except (TypeError, ValueError) as e:
        raise FailedPrecondition(
            f"re-embedding returned something that is not a vector array: {e}"
        ) from None
    return embedded_vectors(out, len(texts), metric)


def _embedded(reembed: Reembed, batches: Iterator[list[str]]) -> Iterator[Any]:
    """What `reembed` returns for each batch: through its `stream` when it has one."""
    stream = getattr(reembed, "stream", None)
    outputs = iter(stream(batches) if stream is not None else map(reembed, batches))
    while True:
        try:
            yield next(outputs)
        except StopIteration:
            return
        except (TypeError, ValueError) as e:
            raise FailedPrecondition(
                f"re-embedding returned something that is not a vector array: {e}"
            ) from None


def _reembed_all(
    ctx: Context, coll: Coll, reembed: Reembed, gen: int, snap: int, prog: ProgressEmitter
) -> tuple[np.ndarray, np.ndarray]:
    """Re-embed every live row up to `snap`, staging the vectors; returns (seqs, vectors)."""
    conn = ctx.reader()
    prog.start("embedding", repo.count_live(conn, coll.id, snap))
    pending: deque[np.ndarray] = deque()  # the seqs of each batch handed out, in order

    def batches() -> Iterator[list[str]]:
        for seqs, _, texts in repo.iter_vectors(conn, coll.id, coll.dim, 0, snap, text=True):
            for lo in range(0, len(texts), REEMBED_BATCH):
                pending.append(seqs[lo : lo + REEMBED_BATCH])
                yield texts[lo : lo + REEMBED_BATCH]

    seq_parts: list[np.ndarray] = []
    vec_parts: list[np.ndarray] = []
    done = 0
    for out in _embedded(reembed, batches()):
        if not pending:
            raise FailedPrecondition("re-embedding returned more batches than it was given")
        s = pending.popleft()
        vecs = embedded_vectors(out, len(s), coll.metric)
        if vec_parts and vecs.shape[1] != vec_parts[0].shape[1]:
            raise FailedPrecondition("re-embedding returned vectors of varying dimension")
        with ctx.tx() as c:
            repo.stage_vectors(c, coll.id, gen, s, vecs)
        seq_parts.append(s)
        vec_parts.append(vecs)
        done += len(s)
        prog.emit(done, getattr(reembed, "where", ""))
    if pending:
        raise FailedPrecondition(
            f"re-embedding returned no vectors for {sum(len(s) for s in pending)} texts"
        )
    if not vec_parts:
        return np.zeros(0, dtype=np.int64), np.zeros((0, coll.dim), dtype=np.float32)
    return np.concatenate(seq_parts), np.concatenate(vec_parts)


def _build(
    ctx: Context, coll: Coll, plan: Plan, gen: int, snap: int, prog: ProgressEmitter
) -> Built:
    if plan.reembed is not None:
        seqs, vecs = _reembed_all(ctx, coll, plan.reembed, gen, snap, prog)
    else:
        seqs, vecs = repo.read_vectors(ctx.reader(), coll.id, coll.dim, 0, snap)
    dim = vecs.shape[1]
    n = int(seqs.size)
    built_type, rparams, note = plan_built_type(plan.target, dim, plan.params, n)
    index = fx.new_index(built_type, dim, coll.metric, rparams, n)
    prog.start("indexing", n)
    held = held_out(n)  # unseen by the index, training included, until it is checked
    keep_seqs, keep_vecs = seqs[~held], vecs[~held]
    if fx.needs_training(built_type, rparams):
        index.train(keep_vecs)
    for lo in range(0, keep_seqs.size, ADD_BATCH):
        index.add_with_ids(keep_vecs[lo : lo + ADD_BATCH], keep_seqs[lo : lo + ADD_BATCH])
        prog.emit(min(n, lo + ADD_BATCH), note)
    return Built(gen, snap, index, built_type, rparams, dim, seqs, vecs, held)


def _check_recall(
    coll: Coll, plan: Plan, built: Built, old_gen: int, prog: ProgressEmitter
) -> None:
    """Refuse the new generation (FailedPrecondition) when its recall@10 is too low, measured
    with the held-out rows as queries; then add them to the index."""
    held, n = built.held, built.n
    prog.start("checking", n)
    recall = recall_at_k(
        _served(built, coll.metric), built.vecs[held], built.vecs[~held], built.seqs[~held],
        coll.metric, k=RECALL_K,
    )
    built.index.add_with_ids(built.vecs[held], built.seqs[held])
    prog.recall = recall
    prog.emit(n, f"recall@10 {recall:.4f} against exact search, {int(held.sum())} held-out "
                 "queries")
    if recall < plan.min_recall:
        msg = (
            f"new generation {built.gen} of {coll.name!r} reached recall@10 {recall:.4f}, below "
            f"the required {plan.min_recall}; generation {old_gen} keeps serving. Raise "
            "hnsw_ef_search / ivf_nprobe / pq_m, or lower min_recall"
        )
        prog.emit(n, msg, phase="refused")
        raise FailedPrecondition(msg)


def _served(built: Built, metric: Metric) -> SearchFn:
    """The search a query of the new generation gets by default, as `search._run` serves it
    (rescoring included), with the vectors of the build in memory for the rescoring."""
    seqs, vecs = built.seqs[~built.held], built.vecs[~built.held]

    def vectors_of(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return s, vecs[np.searchsorted(seqs, s)]

    def run(q: np.ndarray, k: int) -> np.ndarray:
        depth = k
        if fx.lossy(built.built_type, built.rparams):
            depth = fx.rescore_depth(k, fx.default_oversampling(built.built_type))
        params = fx.search_params(built.built_type, built.rparams, depth, None)
        found: np.ndarray = built.index.search(q, depth, params=params)[1]
        if depth == k:
            return found
        return rescore(q, found, vectors_of, k, metric)[1]

    return run


def plan_built_type(
    target: IndexType, dim: int, params: IndexParams, n: int
) -> tuple[IndexType, IndexParams, str]:
    """What to build for `n` items: ivf_pq falls back to flat until it can be trained."""
    check_params(target, dim, params)
    if target == IndexType.IVF_PQ:
        rp = fx.resolve_params(target, dim, params, n)
        if not fx.ivf_trainable(n, rp):
            note = (
                f"{n} items are too few to train ivf_pq; "
                "serving an exact flat index until a later rebuild"
            )
            return IndexType.FLAT, fx.resolve_params(IndexType.FLAT, dim, params), note
        return target, rp, ""
    rp = fx.resolve_params(target, dim, params, n)
    if rp.quantization != params.quantization:
        note = (
            f"{n} items are too few to train {params.quantization.value} quantization "
            f"(at least {fx.QUANT_MIN_TRAIN}); serving float vectors until a later rebuild"
        )
        return target, rp, note
    return target, rp, ""


def _abandon(ctx: Context, coll: Coll, gen: int) -> None:
    try:
        with ctx.tx() as c:
            repo.fail_generation(c, coll.id, gen)
    except Exception:
        log.exception("could not mark generation %d of %s failed", gen, coll.name)
    remove_generation_files(coll, gen)


def _catch_up(ctx: Context, coll: Coll, plan: Plan, built: Built) -> None:
    """Add rows written since the snapshot to the new index. Called under write_mutex."""
    rows = repo.iter_vectors(ctx.reader(), coll.id, coll.dim, built.snap, None, text=True)
    for seqs, vecs, texts in rows:
        if plan.reembed is not None:
            vecs = np.concatenate(
                [
                    _embed(plan.reembed, texts[lo : lo + REEMBED_BATCH], coll.metric)
                    for lo in range(0, len(texts), REEMBED_BATCH)
                ]
            )
            with ctx.tx() as c:
                repo.stage_vectors(c, coll.id, built.gen, seqs, vecs)
        built.index.add_with_ids(vecs, seqs)


def _swap(ctx: Context, coll: Coll, plan: Plan, built: Built) -> tuple[Any, int]:
    """Catch the new index up with writes since its snapshot and make it the active
    generation. Returns the old (index, covered seq)."""
    with coll.write_mutex:
        if coll.dropped:
            raise NotFound(f"collection {coll.name!r} was deleted during the rebuild")
        _catch_up(ctx, coll, plan, built)
        with ctx.tx() as c:
            retired = repo.activate_generation(
                c, coll.id, coll.generation, built.gen, built.built_type, built.rparams,
                plan.target, plan.params, plan.embedder, built.dim, plan.reembed is not None,
            )
        with coll.rw.write():
            old = (coll.index, coll.indexed_seq)
            coll.index, coll.built_type, coll.rparams = built.index, built.built_type, built.rparams
            coll.generation, coll.index_type, coll.params = built.gen, plan.target, plan.params
            coll.embedder, coll.dim = plan.embedder, built.dim
            coll._live_sel = None
    for g in retired:
        remove_generation_files(coll, g)
    return old
