"""A rebuild's re-embedding on a Ray cluster (the `ray_address` setting): the rows of the
snapshot go through the bulk pipeline's embedding stage (`raydata.embed_texts`), while the
few rows written during the build are caught up by the server's own embedder.

Ray is imported only when a rebuild re-embeds, and the session lasts for that rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ragplane.server.bulk.embed import EmbedderSpec


class ClusterReembed:
    """Satisfies `ragplane.index.rebuild.BulkReembed`."""

    def __init__(self, local: Callable[[list[str]], np.ndarray], spec: EmbedderSpec,
                 target: str) -> None:
        self.local, self.spec, self.target = local, spec, target
        self.where = f"on Ray ({target})"

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.local(texts)

    def stream(self, batches: Iterable[list[str]]) -> Iterator[np.ndarray]:
        from ragplane.server.bulk import raydata

        with raydata.session(self.target) as cluster:
            n, _, _ = raydata.pool(cluster, self.spec)
            self.where = f"on {cluster.describe()}, {n} embedding actor{'s' * (n != 1)}"
            yield from raydata.embed_texts(batches, self.spec, cluster)


def factory(target: str, *, model_dir: str, max_seq_length: int):
    """What AdminOps calls for a re-embedding rebuild: (local embed, serving identity) ->
    ClusterReembed on `target`, loading the serving embedder on the cluster."""

    def make(local: Callable[[list[str]], np.ndarray], identity: str) -> ClusterReembed:
        spec = EmbedderSpec(identity, model_dir=model_dir, max_seq_length=max_seq_length)
        return ClusterReembed(local, spec, target)

    return make
