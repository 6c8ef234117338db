"""Embedders and their orchestration (dynamic batching, use-case routing, shadowing)."""

from __future__ import annotations

from ragplane.server.embedding.base import Embedder, identity_of, l2_normalize

__all__ = ["Embedder", "identity_of", "l2_normalize", "load_embedder"]


def load_embedder(
    name: str,
    *,
    model_dir: str = "",
    device: str = "auto",
    max_seq_length: int = 256,
    half: bool = True,
) -> Embedder:
    """Build an embedder by configuration name. Raises ValueError with a clear message.

    `auto` picks the faster canonical backend for the device (see BENCHMARKS.md): ONNX
    Runtime on CPU, sentence-transformers (torch) on CUDA. `half` lets the latter run in fp16
    on CUDA when G1 holds."""
    if name == "auto":
        from ragplane.server.embedding.st import resolve_device

        name = "sentence-transformers" if resolve_device(device) == "cuda" else "onnx"
    if name == "fake":
        from ragplane.server.embedding.fake import FakeEmbedder

        return FakeEmbedder(max_seq_length=max_seq_length)
    if name == "sentence-transformers":
        from ragplane.server.embedding.st import SentenceTransformersEmbedder

        return SentenceTransformersEmbedder(model_dir or None, device, max_seq_length, half=half)
    if name == "onnx":
        from ragplane.server.embedding.onnx import OnnxEmbedder

        return OnnxEmbedder(model_dir or None, device, max_seq_length)
    if name == "embedder_rs":
        from ragplane.server.embedding.rust import RustEmbedder

        return RustEmbedder(model_dir or None, device, max_seq_length)
    raise ValueError(f"unknown embedder {name!r}")
