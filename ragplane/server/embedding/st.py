"""The canonical embedder: sentence-transformers (torch), CUDA when torch sees a GPU.

On CPU it is `SentenceTransformer.encode`. On CUDA it runs the same weights through
`ragplane.server.embedding.st_fast.PipelinedEncoder` (fp16 when G1 holds, overlapped tokenisation,
token-budget batches), because encode() leaves a GPU mostly idle (see GPU.md numbers in
BENCHMARKS.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragplane.server.embedding.base import Identified
from ragplane.server.embedding.model_files import default_model_dir
from ragplane.server.embedding.tokens import TokenCounter

log = logging.getLogger(__name__)
# encode() sorts by length and cuts batches of this many: 32 keeps padding waste small
# while a pass still amortises its overhead.
ENCODE_BATCH = 32


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_st(cls, path: Path, device: str):
    """SDPA attention on CUDA (fused, fp16-friendly kernels); the CPU keeps the library's
    default so its vectors do not move. Older transformers without the option load plainly."""
    if not device.startswith("cuda"):
        return cls(str(path), device=device, local_files_only=True)
    try:
        return cls(
            str(path),
            device=device,
            local_files_only=True,
            model_kwargs={"attn_implementation": "sdpa"},
        )
    except (TypeError, ValueError, ImportError) as exc:
        log.warning("sdpa attention unavailable (%s); loading the default", exc)
        return cls(str(path), device=device, local_files_only=True)


class SentenceTransformersEmbedder(Identified):
    name = "sentence-transformers"
    family = "sentence-transformers"

    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str = "auto",
        max_seq_length: int = 256,
        *,
        half: bool = True,
        pipelined: bool | None = None,
        token_budget: int | None = None,
    ) -> None:
        """`half`: fp16 on the pipelined path when it keeps G1 against fp32 (checked at load).
        `pipelined`: None = on for CUDA only; the CPU keeps encode() and its vectors."""
        import sentence_transformers
        from sentence_transformers import SentenceTransformer

        path = Path(model_dir) if model_dir else default_model_dir()
        if not (path / "config.json").exists():
            raise ValueError(f"{path} is not a sentence-transformers model directory")
        self.device = resolve_device(device)
        if pipelined is None:
            pipelined = self.device.startswith("cuda")
        self._model = _load_st(SentenceTransformer, path, self.device)
        # The shipped tokenizer.json says 128; sentence-transformers passes max_length on
        # every call, so setting max_seq_length here is what makes it truncate at 256.
        self._model.max_seq_length = max_seq_length
        self.max_seq_length = max_seq_length
        self.dim = int(self._model.get_embedding_dimension())
        self.model = path.name if path.name != "model" else "all-MiniLM-L6-v2"
        self.version = sentence_transformers.__version__
        self._tokens = TokenCounter(path, max_seq_length)
        self.hf_tokenizer = self._tokens.tokenizer  # chunking counts with it
        self._fast = None
        if pipelined:
            from ragplane.server.embedding.st_fast import DEFAULT_TOKEN_BUDGET, PipelinedEncoder

            self._fast = PipelinedEncoder(
                self._model,
                path,
                max_seq_length,
                half=half,
                token_budget=token_budget or DEFAULT_TOKEN_BUDGET,
            )
        log.info(
            "sentence-transformers %s on %s (%s), dim %d",
            self.model,
            self.device,
            self.precision,
            self.dim,
        )

    @property
    def precision(self) -> str:
        """How the vectors are computed: encode-fp32, or the pipelined path's fp16/fp32."""
        return f"pipelined-{self._fast.precision}" if self._fast else "encode-fp32"

    @property
    def largest_run(self) -> int:
        """Most texts one forward pass takes; a longer call is cut into passes (warm-up)."""
        if self._fast is not None:
            return max(1, self._fast.token_budget // self.max_seq_length)
        return ENCODE_BATCH

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        if self._fast is not None:
            return self._fast.encode(texts, normalize)
        vectors = self._model.encode(
            list(texts),
            batch_size=ENCODE_BATCH,
            normalize_embeddings=normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.truncated(texts)

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.untruncated(texts)
