"""embedder_rs: a Rust (burn) BERT sentence embedder matching sentence-transformers.

    >>> from embedder_rs import Embedder
    >>> emb = Embedder(model_dir, backend="cpu")
    >>> vectors = emb.embed(["hello world"])  # float32 [1, emb.dim], L2-normalised
"""

from __future__ import annotations

from ._native import Embedder, EmbedderError, __version__

__all__ = ["Embedder", "EmbedderError", "__version__"]
