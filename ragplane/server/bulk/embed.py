"""The embedding stage of the bulk pipeline: the canonical embedder, loaded once per worker
(a Ray actor, or this process), over column batches.

The vectors must be the ones the server's Embed would return for the same text, so the
embedder is named by the identity (`name@version`) the collection records, and a worker
whose installed embedder has another version refuses to start rather than write vectors
of another model into the collection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragplane.core.errors import FailedPrecondition
from ragplane.server.bulk.rows import ERROR, TEXT

VECTOR = "vector"


@dataclass(frozen=True)
class EmbedderSpec:
    """What a worker loads; small and picklable, so it travels to Ray actors."""

    identity: str  # name@version of the vectors the collection holds
    model_dir: str = ""  # empty = the bundled all-MiniLM-L6-v2
    device: str = "auto"
    max_seq_length: int = 256
    # Intra-op threads of the model; 0 = the library's default. Ray sets OMP_NUM_THREADS
    # to an actor's num_cpus (1), which ONNX Runtime and torch follow, so an actor is given
    # its share of its node's cores explicitly (`raydata.pool`).
    threads: int = 0

    @property
    def name(self) -> str:
        return self.identity.partition("@")[0]

    def load(self):
        """The embedder, checked to be `identity`. FailedPrecondition when it is not."""
        from ragplane.server.embedding import load_embedder

        if self.name == "onnx" and self.threads:
            from ragplane.server.embedding.onnx import OnnxEmbedder

            embedder = OnnxEmbedder(
                self.model_dir or None, self.device, self.max_seq_length, threads=self.threads
            )
        else:
            try:
                embedder = load_embedder(
                    self.name, model_dir=self.model_dir, device=self.device,
                    max_seq_length=self.max_seq_length,
                )
            except ValueError as exc:
                raise FailedPrecondition(f"cannot load embedder {self.identity}: {exc}") from None
            if self.threads and self.name == "sentence-transformers":
                import torch

                torch.set_num_threads(self.threads)
        if embedder.identity != self.identity:
            raise FailedPrecondition(
                f"the vectors must come from {self.identity}, but this machine has "
                f"{embedder.identity}; install the same version here (and on every Ray node)"
            )
        return embedder


class EmbedBatch:
    """A column batch in, the same batch plus `vector` ([n, dim] float32, L2-normalised)
    out. Rows with an `error` get a zero vector and are never embedded. The model loads
    once, in the constructor: Ray Data builds one per actor of the pool."""

    def __init__(self, spec: EmbedderSpec) -> None:
        self.embedder = spec.load()
        self.dim = int(self.embedder.dim)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = batch[TEXT]
        ok = (batch[ERROR] == "") if ERROR in batch else np.ones(len(texts), dtype=bool)
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        if ok.any():
            vectors[ok] = self.embedder.embed([str(t) for t in texts[ok]])
        return {**batch, VECTOR: vectors}
