"""Token counting with the model's own tokenizer.json, truncation overridden.

The bundled tokenizer.json truncates (and pads) at 128; every embedder here uses the
model's max_seq_length (256) instead, so counts come from a tokenizer reconfigured to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer


class TokenCounter:
    def __init__(self, model_dir: Path, max_seq_length: int) -> None:
        self.max_seq_length = max_seq_length
        self._full = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._full.no_padding()
        self._full.no_truncation()

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer without truncation or padding (what chunking counts with)."""
        return self._full

    def untruncated(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._full.encode_batch(list(texts))]

    def truncated(self, texts: Sequence[str]) -> list[int]:
        return [min(n, self.max_seq_length) for n in self.untruncated(texts)]
