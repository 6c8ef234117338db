"""embedder_rs (burn, Rust) behind the Embedder protocol. Its errors cross as
`embedder_rs.EmbedderError` and are re-raised as ValueError (bad input / bad model)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragplane.server.embedding.base import Identified
from ragplane.server.embedding.model_files import default_model_dir
from ragplane.server.embedding.tokens import TokenCounter

log = logging.getLogger(__name__)


class RustEmbedder(Identified):
    name = "embedder_rs"

    def __init__(
        self, model_dir: str | Path | None = None, device: str = "auto", max_seq_length: int = 256
    ) -> None:
        try:
            import embedder_rs

            embedder_rs.Embedder  # noqa: B018  (the source folder alone imports as a namespace)
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                "embedder_rs is not installed; `make install` builds it (needs cargo)"
            ) from exc
        path = Path(model_dir) if model_dir else default_model_dir()
        backend = {"auto": "auto", "cpu": "cpu", "cuda": "wgpu", "wgpu": "wgpu"}.get(device, "auto")
        try:
            self._e = embedder_rs.Embedder(path, backend=backend, max_seq_length=max_seq_length)
        except embedder_rs.EmbedderError as exc:
            raise ValueError(str(exc)) from exc
        self._error = embedder_rs.EmbedderError
        self.version = embedder_rs.__version__
        self.dim = int(self._e.dim)
        self.max_seq_length = int(self._e.max_seq_length)
        self.device = f"{self._e.backend}:{self._e.adapter}"
        self.kernel = getattr(self._e, "kernel", "")
        self.model = path.name if path.name != "model" else "all-MiniLM-L6-v2"
        self._tokens = TokenCounter(path, max_seq_length)
        self.hf_tokenizer = self._tokens.tokenizer  # chunking counts with it
        # one line for what the backend choice found (device="auto" on Linux probes wgpu
        # only when a GPU device node exists: the probe's driver noise is gone)
        log.info(
            "embedder_rs %s on %s, kernel %s (%s)",
            self.version,
            self.device,
            self.kernel,
            getattr(self._e, "backend_reason", f"{device} asked for"),
        )

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        try:
            return self._e.embed(list(texts), normalize=normalize)
        except self._error as exc:
            raise ValueError(str(exc)) from exc

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.truncated(texts)

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.untruncated(texts)
