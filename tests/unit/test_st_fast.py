"""The canonical's pipelined path (st_fast) on CUDA turns cuDNN's attention off: cuDNN
planned every new (rows, width) in fp16, 50-72 ms each on an H200 (BENCHMARKS 8). The
flag is process-wide and set at construction, so this checks it without a GPU."""

from __future__ import annotations

import pytest
import torch

from ragplane.server.embedding.model_files import default_model_dir
from ragplane.server.embedding.st_fast import PipelinedEncoder

# named as sentence-transformers names its modules: st_fast finds them by type name
Pooling = type("Pooling", (), {"pooling_mode": "mean", "get_config_dict": lambda self: {}})


class _Transformer:
    def __init__(self) -> None:
        self.auto_model = torch.nn.Identity()


class _FakeSentenceTransformer:
    """What PipelinedEncoder reads of a loaded SentenceTransformer, on `device`."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._modules = {"0": _Transformer(), "1": Pooling()}

    def __getitem__(self, i: int) -> object:
        return self._modules[str(i)]

    def get_embedding_dimension(self) -> int:
        return 384


@pytest.fixture
def cudnn_attention_on():
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(True)


@pytest.mark.parametrize(("device", "cudnn_after"), [("cuda", False), ("cpu", True)])
def test_the_cuda_path_turns_cudnn_attention_off(cudnn_attention_on, device, cudnn_after):
    enc = PipelinedEncoder(_FakeSentenceTransformer(device), default_model_dir(), 256, half=False)
    try:
        assert torch.backends.cuda.cudnn_sdp_enabled() is cudnn_after
    finally:
        enc.close()
