"""How the shadow's vectors are compared with the canonical's, batch by batch: per-row
cosine, after checking that the two can be compared row by row at all."""

from __future__ import annotations

import numpy as np

from ragplane.server.embedding.base import l2_normalize


class ShadowOutputError(ValueError):
    """The shadow answered, but with vectors that cannot be compared to the canonical's:
    NaN or infinite values, another dimension, or another number of vectors."""


def compare_rows(
    control: np.ndarray, candidate: np.ndarray, *, min_cosine: float
) -> tuple[np.ndarray, bool]:
    """Per-row cosine, and whether the batch holds the case's G1 floor. Raises
    ShadowOutputError when the two cannot be compared row by row; the experiment
    records that as the candidate's error."""
    a, b = np.asarray(control), np.asarray(candidate)
    if b.ndim != 2 or b.shape[0] != a.shape[0] or b.shape[1:] != a.shape[1:]:
        raise ShadowOutputError(
            f"shape {b.shape} where {a.shape} was expected "
            f"({a.shape[0]} vectors of dim {a.shape[1] if a.ndim == 2 else '?'})"
        )
    bad = ~np.isfinite(b).all(axis=1) | ~np.isfinite(a).all(axis=1)
    if bad.any():
        raise ShadowOutputError(f"NaN or infinite values in {int(bad.sum())} of {len(b)} vectors")
    a, b = l2_normalize(a), l2_normalize(b)
    cos = np.clip(np.sum(a * b, axis=1, dtype=np.float64), -1.0, 1.0)
    return cos, bool(cos.min() >= min_cosine)
