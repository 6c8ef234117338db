"""The canonical's pipelined path (st_fast) on CUDA turns cuDNN's attention off: cuDNN
planned every new (rows, width) in fp16, 50-72 ms each on an H200 (BENCHMARKS 8). The
flag is process-wide and set at construction, so this checks it without a GPU, in a
process of its own: the flag stays with the process, and torch's state is not the test
run's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragplane.server.embedding.model_files import default_model_dir

PROBE = """
import sys
from pathlib import Path

import torch
from ragplane.server.embedding.st_fast import PipelinedEncoder

# named as sentence-transformers names its modules: st_fast finds them by type name
Pooling = type("Pooling", (), {"pooling_mode": "mean", "get_config_dict": lambda self: {}})


class Transformer:
    def __init__(self):
        self.auto_model = torch.nn.Identity()


class FakeSentenceTransformer:
    def __init__(self, device):
        self.device = device
        self._modules = {"0": Transformer(), "1": Pooling()}

    def __getitem__(self, i):
        return self._modules[str(i)]

    def get_embedding_dimension(self):
        return 384


torch.backends.cuda.enable_cudnn_sdp(True)
enc = PipelinedEncoder(FakeSentenceTransformer(sys.argv[1]), Path(sys.argv[2]), 256, half=False)
enc.close()
print(torch.backends.cuda.cudnn_sdp_enabled())
"""


@pytest.mark.parametrize(("device", "cudnn_after"), [("cuda", "False"), ("cpu", "True")])
def test_the_cuda_path_turns_cudnn_attention_off(device, cudnn_after):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, device, str(default_model_dir())],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == cudnn_after
