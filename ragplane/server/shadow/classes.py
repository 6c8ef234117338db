"""Traffic classes: the gates are judged per size of batch, not over the traffic mix.

A shadow that is faster on short texts and slower on window-length ones passes a pooled
G2 whenever short texts dominate the sample, and fails it when the mix changes. So each
sampled batch is put in a class by its longest text in tokens (the padded length that sets
the work of a forward pass), and G1 and G2 must hold in every class that carries a real
share of the traffic (`Gates.min_class_share`).
"""

from __future__ import annotations

from collections.abc import Sequence

# (name, the longest text's tokens at most), in order; the last class is open-ended
CLASSES: tuple[tuple[str, float], ...] = (
    ("short", 32),
    ("medium", 128),
    ("window", float("inf")),
)
NAMES = tuple(name for name, _ in CLASSES)
LIMITS = {
    "short": "<= 32 tokens",
    "medium": "33-128 tokens",
    "window": "> 128 tokens, up to the window",
}


def classify(tokens: Sequence[int]) -> str:
    """The class of a batch whose texts have `tokens` tokens each (special tokens
    included, after truncation). An empty batch is short."""
    longest = max(tokens, default=0)
    for name, limit in CLASSES:
        if longest <= limit:
            return name
    return NAMES[-1]  # pragma: no cover  (the last limit is infinite)
