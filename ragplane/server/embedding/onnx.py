"""The canonical embedder on ONNX Runtime, exported from the same weights as the torch one.

The export (BERT + masked mean pooling, dynamic batch and length) runs once and is cached
under RAGPLANE_CACHE_DIR (default ~/.cache/ragplane), keyed by the weights' hash, so every
later start loads it in well under a second. Tokenisation uses the model's tokenizer.json
with truncation at max_seq_length (not the shipped 128) and padding to the longest text of
each length-sorted sub-batch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragplane.server.embedding.base import Identified, l2_normalize
from ragplane.server.embedding.model_files import default_model_dir
from ragplane.server.embedding.tokens import TokenCounter

log = logging.getLogger(__name__)
# Length-sorted sub-batches: little padding, enough work per run. On 2 CPU cores, 256
# sentences ran at 234-251 texts/s in runs of 16 against 191-217 in runs of 32 (and
# 161-165 in 64), with long passages level; a GPU wants more work per run.
SUB_BATCH = {"cpu": 16, "cuda": 32}


def cache_dir() -> Path:
    return Path(os.environ.get("RAGPLANE_CACHE_DIR") or Path.home() / ".cache" / "ragplane")


def _weights_key(model_dir: Path, max_seq_length: int) -> str:
    h = hashlib.sha256()
    with open(model_dir / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    h.update((model_dir / "config.json").read_bytes())
    return f"{h.hexdigest()[:24]}-{max_seq_length}"


def export_onnx(model_dir: Path, target: Path) -> None:
    """Export BERT + mean pooling to `target` (atomically), from the sentence-transformers
    weights. Needs torch and onnx; runs once per weights."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(
        str(model_dir),
        device="cpu",
        local_files_only=True,
        model_kwargs={"attn_implementation": "eager"},
    )
    bert = st[0].auto_model.eval()

    class Pooled(torch.nn.Module):
        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    ids = torch.ones(2, 16, dtype=torch.long)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0  # trace with padding present
    axes = {0: "batch", 1: "tokens"}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / "model.onnx"
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer chatter about shape-constant branches
            torch.onnx.export(
                Pooled(bert),
                (ids, mask, torch.zeros_like(ids)),
                str(out),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["sentence_embedding"],
                dynamic_axes={
                    "input_ids": axes,
                    "attention_mask": axes,
                    "token_type_ids": axes,
                    "sentence_embedding": {0: "batch"},
                },
                opset_version=17,
                dynamo=False,
            )
        os.replace(out, target)


class OnnxEmbedder(Identified):
    name = "onnx"
    family = "sentence-transformers"  # a canonical backend: same weights, same vectors

    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str = "auto",
        max_seq_length: int = 256,
        threads: int | None = None,
    ) -> None:
        """`threads`: ONNX Runtime's intra-op pool (default: one per physical core)."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        path = Path(model_dir) if model_dir else default_model_dir()
        if not (path / "model.safetensors").exists():
            raise ValueError(f"{path} has no model.safetensors to export to ONNX")
        onnx_path = cache_dir() / "onnx" / _weights_key(path, max_seq_length) / "model.onnx"
        if not onnx_path.exists():
            log.info("exporting %s to ONNX (once) at %s", path, onnx_path)
            export_onnx(path, onnx_path)
        providers = ["CPUExecutionProvider"]
        if device in ("auto", "cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        self._session = ort.InferenceSession(str(onnx_path), opts, providers=providers)
        self.device = "cuda" if self._session.get_providers()[0].startswith("CUDA") else "cpu"
        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tok.enable_truncation(max_seq_length)
        self._tok.no_padding()
        self._tokens = TokenCounter(path, max_seq_length)
        self.hf_tokenizer = self._tokens.tokenizer  # chunking counts with it
        self.max_seq_length = max_seq_length
        self.dim = int(self._session.get_outputs()[0].shape[-1] or 0) or self._probe_dim()
        self.model = path.name if path.name != "model" else "all-MiniLM-L6-v2"
        self.version = ort.__version__
        self._args = (model_dir, device, max_seq_length, threads)
        self._twin: OnnxEmbedder | None = None
        self._twin_lock = threading.Lock()

    def timing_twin(self) -> OnnxEmbedder:
        """A second session of the same model with its own intra-op pool, made once
        (base.Identified.timing_twin: why; measured +155 MiB RSS with all-MiniLM-L6-v2)."""
        with self._twin_lock:
            if self._twin is None:
                self._twin = OnnxEmbedder(*self._args)
            return self._twin

    @property
    def largest_run(self) -> int:
        """Most texts one ONNX Runtime run takes; `embed` cuts longer calls (warm-up)."""
        return SUB_BATCH[self.device]

    def _probe_dim(self) -> int:
        return int(self._run(["x"]).shape[1])


    def _run(self, texts: Sequence[str]) -> np.ndarray:
        enc = self._tok.encode_batch(list(texts))
        width = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(enc):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        (out,) = self._session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )
        return out

    def embed(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        lengths = self._tokens.truncated(texts)
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        step = SUB_BATCH[self.device]
        for start in range(0, len(texts), step):
            idx = order[start : start + step]
            out[idx] = self._run([texts[i] for i in idx])
        return l2_normalize(out) if normalize else out

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.truncated(texts)

    def count_tokens_untruncated(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.untruncated(texts)
