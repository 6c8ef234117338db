"""Creating, describing and dropping collections."""

from __future__ import annotations

import shutil
import time

from ragplane.core.errors import AlreadyExists, InvalidArgument
from ragplane.index import faiss_index as fx
from ragplane.index import repository as repo
from ragplane.index.context import Context
from ragplane.index.state import Coll, chunking_json
from ragplane.index.types import Chunking, CollectionInfo, IndexParams, IndexType, Metric
from ragplane.index.validate import check_dim, check_name, check_params, to_enum


def create(
    ctx: Context, tenant: str, name: str, dim: int, metric: Metric, index_type: IndexType,
    embedder: str, params: IndexParams, lexical_index: bool = True,
    chunking: Chunking = Chunking(),  # noqa: B008 - frozen
) -> CollectionInfo:
    """Create an empty collection, with a lexical index of its text unless `lexical_index` is
    False, and `chunking` recorded (the server splits by it). Raises AlreadyExists if
    (tenant, name) is taken."""
    ctx.check_open()
    dim, metric, index_type, params = checked(tenant, name, dim, metric, index_type, params,
                                              embedder)
    # ivf_pq needs training data: serve exactly until a rebuild can train it
    built_type = IndexType.FLAT if index_type == IndexType.IVF_PQ else index_type
    rparams = fx.resolve_params(built_type, dim, params)
    now = time.time()
    with ctx.reg_lock:
        if ctx.find(tenant, name) is not None:
            raise AlreadyExists(
                f"collection {name!r} already exists; pick another name or delete it first"
            )
        with ctx.tx() as c:
            coll_id = repo.insert_collection(
                c, tenant, ctx.kind, name, dim, metric.value, params, index_type, built_type,
                rparams, embedder, now, bool(lexical_index), chunking_json(chunking),
            )
        coll = Coll(
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
            dir=ctx.idx_dir / str(coll_id),
            built_type=built_type,
            rparams=rparams,
            index=fx.new_index(built_type, dim, metric, rparams),
            purpose=ctx.kind,
            lexical=bool(lexical_index),
            chunking=chunking,
        )
        ctx.register(coll)
    return info(coll)


def checked(
    tenant: str, name: str, dim: int, metric: Metric, index_type: IndexType, params: IndexParams,
    embedder: str,
) -> tuple[int, Metric, IndexType, IndexParams]:
    """A new collection's settings checked, as (dim, metric, index_type, params)."""
    check_name(name)
    if not isinstance(tenant, str) or not tenant:
        raise InvalidArgument("tenant must be a non-empty string")
    dim = check_dim(dim)
    metric = to_enum(Metric, metric, "metric")
    index_type = to_enum(IndexType, index_type, "index_type")
    params = check_params(index_type, dim, params)
    if not isinstance(embedder, str):
        raise InvalidArgument("embedder must be a string (name@version)")
    return dim, metric, index_type, params


def delete(ctx: Context, tenant: str, name: str) -> None:
    with ctx.reg_lock:
        coll = ctx.get(tenant, name)
        with coll.write_mutex:
            with ctx.tx() as c:
                repo.delete_collection(c, coll.id)
            with coll.rw.write():
                coll.dropped = True
            ctx.unregister(coll)
    with coll.ckpt_lock:
        shutil.rmtree(coll.dir, ignore_errors=True)


def info(coll: Coll) -> CollectionInfo:
    with coll.rw.read():
        ntotal = coll.index.ntotal
        live = coll.live_count
        items = coll.item_count
        params = coll.rparams if coll.built_type == coll.index_type else coll.params
        return CollectionInfo(
            name=coll.name,
            tenant=coll.tenant,
            dim=coll.dim,
            metric=coll.metric,
            index_type=coll.index_type,
            embedder=coll.embedder,
            generation=coll.generation,
            count=items,
            tombstones=max(0, ntotal - live),
            params=params,
            created_at=coll.created_at,
            lexical_index=coll.lexical,
            chunking=coll.chunking,
            chunks=live,
        )


def check_embedder(embedder: object) -> str:
    """A collection's embedder, as both stores check it: name@version, not empty."""
    if not isinstance(embedder, str) or not embedder:
        raise InvalidArgument("embedder must be a non-empty string (name@version)")
    return embedder


def set_embedder(ctx: Context, tenant: str, name: str, embedder: str) -> None:
    """Record that the collection's vectors come from `embedder` (name@version)."""
    embedder = check_embedder(embedder)
    coll = ctx.get(tenant, name)
    with coll.write_mutex:
        with ctx.tx() as c:
            repo.set_embedder(c, coll.id, coll.generation, embedder)
        coll.embedder = embedder
