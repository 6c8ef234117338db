from os import PathLike
from typing import Literal

import numpy as np
import numpy.typing as npt

__version__: str

class EmbedderError(Exception):
    """Any failure of embedder_rs (bad model directory, missing tensor, shape mismatch,
    tokenizer, backend or inference error)."""

class Embedder:
    """A BERT sentence-transformers model (config.json, model.safetensors,
    tokenizer.json) running on burn's CPU (flex) or wgpu backend."""

    def __init__(
        self,
        model_dir: str | PathLike[str],
        backend: Literal["auto", "cpu", "wgpu"] | str = "auto",
        max_seq_length: int | None = None,
        batch_size: int = 32,
        max_batch_tokens: int = 16384,
    ) -> None: ...
    def embed(self, texts: list[str], normalize: bool = True) -> npt.NDArray[np.float32]:
        """Embeddings of shape [len(texts), dim]; L2-normalised unless normalize=False."""
    def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts after truncation to max_seq_length ([CLS]/[SEP] included)."""
    @property
    def backend(self) -> Literal["cpu", "wgpu"]: ...
    @property
    def backend_reason(self) -> str:
        """Why this backend: what was asked for and, for "auto", what it found (on Linux
        without a GPU device node, wgpu is not probed at all)."""
    @property
    def kernel(self) -> Literal["avx512", "avx2", "neon", "portable", "wgpu"]:
        """The kernels in use: the CPU's vector instruction set the host kernels chose
        (`EMBEDDER_RS_KERNEL` may force a narrower one), or "wgpu" on that backend."""
    @property
    def adapter(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def max_seq_length(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
