"""Which embedders the server runs: the canonical one (in this process, or on Ray Serve
when `embed_backend = ray_serve`) and where a rebuild re-embeds (`ray_address`). Ray is
imported only when a setting asks for it."""

from __future__ import annotations

import contextlib

from ragplane.core.errors import InvalidArgument
from ragplane.server.embedding import Embedder, load_embedder
from ragplane.server.settings import Settings


def cluster_reembed(settings: Settings):
    """Re-embedding on Ray when `ray_address` names a cluster (Ray loads only then)."""
    if not settings.ray_address.strip():
        return None
    from ragplane.server.bulk.reembed import factory

    return factory(
        settings.ray_address.strip(),
        model_dir=settings.model_dir,
        max_seq_length=settings.max_seq_length,
    )


def canonical(stack: contextlib.ExitStack, settings: Settings) -> Embedder:
    """The canonical embedder: a Ray Serve deployment when `embed_backend` says so, else
    loaded in this process."""
    try:
        if settings.embed_backend == "ray_serve":
            return stack.enter_context(ray_serve_embedder(settings))
        return load_embedder(
            settings.embedder,
            model_dir=settings.model_dir,
            device=settings.device,
            max_seq_length=settings.max_seq_length,
            half=settings.cuda_fp16,
        )
    except (ValueError, OSError) as exc:
        raise InvalidArgument(f"cannot load embedder {settings.embedder!r}: {exc}") from exc


def ray_serve_embedder(settings: Settings):
    """The canonical embedder as a Ray Serve deployment (Ray loads only for this backend).
    Unreachable Ray or replicas that cannot start stop the start, with the reason."""
    from ragplane.server.embedding.ray_serve import RayServeEmbedder, ReplicaSpec, ServeOptions

    spec = ReplicaSpec(
        settings.embedder,
        model_dir=settings.model_dir,
        device=settings.device,
        max_seq_length=settings.max_seq_length,
        half=settings.cuda_fp16,
    )
    options = ServeOptions(
        address=settings.ray_address,
        app=settings.ray_serve_app,
        min_replicas=settings.ray_serve_min_replicas,
        max_replicas=settings.ray_serve_max_replicas,
        replica_cpus=settings.ray_serve_replica_cpus,
        gpu=settings.ray_serve_gpu,
    )
    return RayServeEmbedder(spec, options)
