"""Deterministic test vectors and a numpy reference search (no fixtures needed)."""

from __future__ import annotations

import numpy as np

from ragplane.index.types import Metric, Record


def make_vectors(n: int, dim: int, seed: int = 0, *, clusters: int = 0) -> np.ndarray:
    """[n, dim] float32, the same for the same arguments. With `clusters`, points are
    drawn around that many centres, which is closer to real embeddings than pure noise."""
    rng = np.random.default_rng(seed)
    if clusters:
        centres = rng.standard_normal((clusters, dim)).astype(np.float32) * 3
        x = centres[rng.integers(0, clusters, n)] + rng.standard_normal((n, dim)).astype(np.float32)
    else:
        x = rng.standard_normal((n, dim)).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def make_records(vectors: np.ndarray, prefix: str = "id", metadata=None) -> list[Record]:
    """Records `prefix0..` with text "text i" and metadata from `metadata(i)` (or {"i": i})."""
    return [
        Record(
            id=f"{prefix}{i}",
            vector=v,
            text=f"text {i}",
            metadata=metadata(i) if metadata else {"i": i},
        )
        for i, v in enumerate(vectors)
    ]


def normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def brute_force(
    base: np.ndarray, queries: np.ndarray, k: int, metric: Metric
) -> tuple[np.ndarray, np.ndarray]:
    """Exact (scores, positions) with the engine's convention: higher is better."""
    base = base.astype(np.float64)
    queries = np.atleast_2d(queries).astype(np.float64)
    if metric == Metric.COSINE:
        base, queries = normalise(base), normalise(queries)
    if metric == Metric.L2:
        scores = -((queries**2).sum(1)[:, None] - 2 * queries @ base.T + (base**2).sum(1)[None, :])
    else:
        scores = queries @ base.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def embedding_like(
    n: int, dim: int, seed: int = 0, *, topics: int = 50, latent: int = 16
) -> np.ndarray:
    """[n, dim] unit float32 vectors shaped like text embeddings: topics in a `latent`-
    dimensional space (most of an embedding's variance lies in few directions), projected
    into `dim`, with small isotropic noise. Nearest neighbours are close but not
    duplicates, so an approximate index misses some: recall below 1 that moves with its
    parameters. The same arguments give the same vectors; another seed gives new points of
    the same topics: held-out queries."""
    rng = np.random.default_rng(1_000_003)  # topics and projection: shared by every seed
    centres = rng.standard_normal((topics, latent))
    proj = rng.standard_normal((latent, dim)) / np.sqrt(latent)
    rng = np.random.default_rng(seed)
    z = centres[rng.integers(0, topics, n)] + 0.6 * rng.standard_normal((n, latent))
    x = z @ proj + 0.15 * rng.standard_normal((n, dim))
    return np.ascontiguousarray(normalise(x), dtype=np.float32)
