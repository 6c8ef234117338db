"""The one small `Embedder` protocol every embedder satisfies.

Canonical (sentence-transformers, onnx), the Rust shadow (embedder_rs) and the
deterministic fake all implement it; `ragplane.server.embedding.load` picks one by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    #: Short family name, e.g. "sentence-transformers", "embedder_rs", "fake".
    name: str
    #: Version of the implementation (library or crate version), part of `identity`.
    version: str
    #: The model the vectors come from, e.g. "all-MiniLM-L6-v2".
    model: str
    dim: int
    max_seq_length: int
    #: Where it runs, e.g. "cpu", "cuda:0", "wgpu:llvmpipe".
    device: str

    @property
    def identity(self) -> str:
        """`name@version`: what collections record and replies report."""
        ...

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        """Embed texts -> float32 [len(texts), dim]. Texts longer than max_seq_length
        tokens are truncated. Raises ValueError on unusable input."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text after truncation to max_seq_length, special tokens included."""
        ...

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text without truncation (to refuse over-long texts when asked)."""
        ...

    def timing_twin(self) -> Embedder:
        """The same vectors from thread pools of its own, for G2's timed runs
        (Identified.timing_twin; by default the instance itself)."""
        ...


def identity_of(e: Embedder) -> str:
    return f"{e.name}@{e.version}"


class Identified:
    """`identity` from `name` and `version`, the same way for every embedder."""

    name: str
    version: str

    @property
    def identity(self) -> str:
        return identity_of(self)  # type: ignore[arg-type]

    def timing_twin(self) -> Embedder:
        """An instance with the same weights, hence the same vectors, whose thread pools are
        its own, for G2's timed runs of the canonical (server.shadow.timing). Timed runs on
        the instance that serves share its pool with the requests being served, which slows
        them more than the shadow's, whose pool is apart. Default: this instance."""
        return self  # type: ignore[return-value]


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation; zero rows stay zero. float32 in, float32 out."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return (vectors / norms).astype(np.float32, copy=False)
