"""The canonical's GPU path: the same BERT and mean pooling as `SentenceTransformer.encode`,
fed so that the accelerator, not the host, bounds it.

On an H200 (see GPU.md) encode() tokenised and ran the forward pass in series on one
thread: tokenisation alone 3,819 passages/s, the fp16 forward alone 30,654/s, end to end
2,046/s. Here:
- tokenisation uses the fast tokenizer directly (no per-text Python dicts), truncated at
  max_seq_length (not the shipped tokenizer.json's 128), on worker threads, one chunk ahead
  of the forward pass, into pinned host memory copied with non_blocking transfers;
- texts are length-sorted and cut into chunks under a token budget, each padded to its own
  longest text, so padding waste stays small and several chunks per call overlap;
- the forward pass runs in fp16 when that keeps G1 against fp32 (checked at load on
  held-out text, else fp32), with torch's SDPA attention where transformers offers it;
- a chunk's result is copied back while the next chunk's forward pass is queued.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: G1: the lowest cosine the fp16 path may have against fp32 on held-out text.
G1_MIN_COSINE = 0.9999
#: Tokens in one forward pass (rows x padded length). 16k keeps an H200 busy in fp16 while
#: a 256-passage call still splits into four chunks that overlap tokenisation and compute.
DEFAULT_TOKEN_BUDGET = 16384
#: Characters per token at the least (BERT wordpieces of English run 4-5): sizes tokenise
#: tasks from lengths alone, erring towards tasks that fit one chunk.
_MIN_CHARS_PER_TOKEN = 3


def _is_mean_pooling(module: Any) -> bool:
    # sentence-transformers 6.x says pooling_mode="mean"; earlier ones a flag per mode
    cfg = module.get_config_dict() if hasattr(module, "get_config_dict") else {}
    return (
        getattr(module, "pooling_mode", None) == "mean"
        or bool(getattr(module, "pooling_mode_mean_tokens", False))
        or cfg.get("pooling_mode") == "mean"
        or bool(cfg.get("pooling_mode_mean_tokens", False))
    )


def held_out_texts() -> list[str]:
    """A few texts no test or benchmark uses, short and long, for the load-time G1 check:
    CPython's own keyword help (pydoc_data), which every Python carries."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a stripped stdlib: fall back to a few lines of our own
        topics = {}
    out = []
    for name in ("assert", "with", "lambda", "while", "yield", "global"):
        words = topics.get(name, "").split()
        if words:
            out.append(" ".join(words[:12]))
            out.append(" ".join(words[20:260]))
    return out or [
        "An acknowledged write is never lost.",
        "Vectors are searched through FAISS over a durable SQLite store " * 12,
    ]


@dataclass
class _Chunk:
    rows: np.ndarray  # positions of these texts in the caller's list
    ids: Any  # torch int64 [rows, width], pinned when the device is CUDA
    mask: Any  # torch int64 [rows, width]


class PipelinedEncoder:
    """Mean-pooled BERT embeddings of a loaded SentenceTransformer, batched for a GPU.

    Works on any torch device (the CPU dry run of scripts/gpu_check.sh uses it there); the
    canonical embedder uses it on CUDA only, so its CPU vectors stay encode()'s."""

    def __init__(
        self,
        st_model: Any,
        model_dir: Path,
        max_seq_length: int,
        *,
        half: bool,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        workers: int = 2,
    ) -> None:
        import torch
        from tokenizers import Tokenizer

        self._torch = torch
        self.device = torch.device(st_model.device)
        self.max_seq_length = max_seq_length
        self.token_budget = max(int(token_budget), max_seq_length)
        self._normalize_always = any(
            type(m).__name__ == "Normalize" for m in st_model._modules.values()
        )
        pooling = [m for m in st_model._modules.values() if type(m).__name__ == "Pooling"]
        if not (pooling and _is_mean_pooling(pooling[0])):
            raise ValueError("the fast path implements mean pooling only")
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tok.enable_truncation(max_seq_length)
        self._tok.no_padding()
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        self._pin = self.device.type == "cuda"
        if self._pin:
            # torch's SDPA prefers cuDNN's attention for fp16 on Hopper, and cuDNN builds a
            # plan for every new shape: ~50-70 ms the first time each (rows, width) comes,
            # and real texts bring new widths all day (H200, torch 2.11: fp16 at batch 1
            # 144 texts/s with it, 335 without; fp32 never takes it). The other fused
            # kernels need no plan. Process-wide: sdpa_kernel() toggles the same global
            # flags, so a per-call context would race between threads.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="st-tokenise")
        first = st_model[0]
        self._fp32 = (getattr(first, "auto_model", None) or first.model).eval()
        self.dim = int(st_model.get_embedding_dimension())
        self.half = False
        self.g1_min_cosine: float | None = None
        self._model = self._fp32
        if half:
            fp16 = copy.deepcopy(self._fp32).half().eval()
            texts = held_out_texts()
            ref = self._encode(texts, self._fp32, normalize=True)
            got = self._encode(texts, fp16, normalize=True)
            self.g1_min_cosine = float(np.min(np.sum(ref * got, axis=1)))
            if self.g1_min_cosine >= G1_MIN_COSINE:
                self._model, self.half = fp16, True
                log.info("fp16 on %s: G1 min cosine %.7f vs fp32", self.device, self.g1_min_cosine)
            else:
                log.warning(
                    "fp16 on %s misses G1 (min cosine %.7f < %s vs fp32 on held-out text); "
                    "running fp32",
                    self.device,
                    self.g1_min_cosine,
                    G1_MIN_COSINE,
                )

    @property
    def precision(self) -> str:
        return "fp16" if self.half else "fp32"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ tokenisation

    def tokenise(self, texts: Sequence[str], rows: np.ndarray) -> list[_Chunk]:
        """Tokenise texts[rows] and cut them, sorted by true length, into chunks of at
        most token_budget tokens (rows x longest). Runs on a worker thread."""
        torch = self._torch
        enc = self._encode_batch([texts[i] for i in rows])
        ids_list = [e.ids for e in enc]
        lengths = np.fromiter((len(x) for x in ids_list), dtype=np.int64, count=len(ids_list))
        order = np.argsort(lengths, kind="stable")
        chunks: list[_Chunk] = []
        start = 0
        while start < len(order):
            end = start + 1
            # sorted ascending: the last row taken is the longest, so it sets the width
            while end < len(order) and (end - start + 1) * lengths[order[end]] <= self.token_budget:
                end += 1
            sel = order[start:end]
            width = int(lengths[sel[-1]])
            ids = np.zeros((len(sel), width), dtype=np.int64)
            for r, j in enumerate(sel):
                ids[r, : lengths[j]] = ids_list[j]
            mask = (np.arange(width)[None, :] < lengths[sel][:, None]).astype(np.int64)
            t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
            if self._pin:
                t_ids, t_mask = t_ids.pin_memory(), t_mask.pin_memory()
            chunks.append(_Chunk(rows[sel], t_ids, t_mask))
            start = end
        return chunks

    # ------------------------------------------------------------------ forward

    def _forward(self, model: Any, chunk: _Chunk, normalize: bool) -> Any:
        torch = self._torch
        ids = chunk.ids.to(self.device, non_blocking=True)
        mask = chunk.mask.to(self.device, non_blocking=True)
        hidden = model(
            input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)
        ).last_hidden_state
        # pool in fp32 whatever the forward's precision: the sum over 256 tokens is where
        # fp16 would lose digits
        m = mask.unsqueeze(-1).to(torch.float32)
        pooled = (hidden.to(torch.float32) * m).sum(1) / m.sum(1).clamp(min=1e-9)
        if normalize or self._normalize_always:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled

    def _encode(self, texts: Sequence[str], model: Any, normalize: bool) -> np.ndarray:
        torch = self._torch
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        # sort by characters (a free proxy for tokens) and cut tasks of about one chunk each,
        # so the first forward pass starts after one task, not after the whole call
        chars = np.fromiter(map(len, texts), dtype=np.int64, count=n)
        order = np.argsort(chars, kind="stable")
        parts = self._parts(order, chars)
        if len(parts) == 1:
            futures = None
            pending_chunks = self.tokenise(texts, parts[0])
        else:
            futures = [self._pool.submit(self.tokenise, texts, p) for p in parts]
            pending_chunks = []
        cuda = self.device.type == "cuda"
        in_flight: list[tuple[np.ndarray, Any, Any]] = []  # rows, host tensor, event

        def drain(keep: int) -> None:
            while len(in_flight) > keep:
                rows, host, event = in_flight.pop(0)
                if event is not None:
                    event.synchronize()
                out[rows] = host.numpy()

        with torch.inference_mode():
            next_part = 0
            while True:
                if not pending_chunks:
                    if futures is None or next_part == len(futures):
                        break
                    pending_chunks = futures[next_part].result()
                    next_part += 1
                chunk = pending_chunks.pop(0)
                pooled = self._forward(model, chunk, normalize)
                if cuda:
                    host = torch.empty(pooled.shape, dtype=torch.float32, pin_memory=True)
                    host.copy_(pooled, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
                else:
                    host, event = pooled, None
                in_flight.append((chunk.rows, host, event))
                drain(keep=1)  # the previous chunk's copy finishes under this one's forward
            drain(keep=0)
        return out

    def _parts(self, order: np.ndarray, chars: np.ndarray) -> list[np.ndarray]:
        est = np.minimum(chars[order] // _MIN_CHARS_PER_TOKEN + 2, self.max_seq_length)
        parts, start = [], 0
        for end in range(1, len(order) + 1):
            # ascending order: est[end - 1] is the longest of order[start:end]
            if end == len(order) or (end - start + 1) * est[end] > self.token_budget:
                parts.append(order[start:end])
                start = end
        return parts

    def encode(self, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
        return self._encode(list(texts), self._model, normalize)
