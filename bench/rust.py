"""4. embedder_rs against the canonical embedders on the same batches: the G2 ratio.

Three embedders as the service builds them (server.embedding), timed on identical batches
of short texts and ~170- and ~250-token passages at batch 1, 8 and 32, the order rotating
every round so none profits from running first. The service's canonical on a CPU is ONNX
Runtime (`embedder = auto`), so the G2 ratio is embedder_rs time / onnx time; torch is
shown for reference (`bench/bench_embedder_rs.py` is the standalone torch-only version).

All three use the same number of threads: the machine's cores, or `--threads N`
(embedder_rs through RAYON_NUM_THREADS, ONNX Runtime's intra-op pool, torch's). Run alone,
on a machine with many cores, without rewriting BENCHMARKS.md:

    python -m bench.rust --threads 16 [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.markdown import table

ROOT = Path(__file__).resolve().parents[1]

BATCHES = (1, 8, 32)
TEXTS_PER_BATCH_SIZE = {1: 32, 8: 64, 32: 128}
# Each timed call starts on an idle machine. ONNX Runtime's pool threads keep spinning for
# tens of milliseconds after a run; the side timed next shared the cores with them (quiet
# machine, one ~250-token passage, 2 threads: embedder_rs 32 ms alone, 48 ms right after an
# ONNX call, 44 ms 10 ms after one, 31.5 ms 50 ms after; ONNX 34.3 ms either way). What G2
# compares is each embedder's own time: after a flip the other one no longer runs at all.
PAUSE_S = 0.05
WARM_UP_BATCHES = 2


def _measure(sides: dict, corpora: dict, rounds: int, results: dict) -> list[list]:
    """Time every side on the same batches, order rotating; fills `results`, returns the
    table rows."""
    names = list(sides)
    rust, with_torch = sides["embedder_rs"], "torch" in sides
    rows = []
    for kind, texts in corpora.items():
        tokens = rust.count_tokens(texts)
        for bs in BATCHES:
            n = min(TEXTS_PER_BATCH_SIZE[bs], len(texts))
            batches = [texts[i : i + bs] for i in range(0, n, bs)]
            spent = dict.fromkeys(names, 0.0)
            # untimed, so that no side meets the cell's shapes (arena growth, scratch sizes)
            # or an idle core's wake-up for the first time inside the timing
            for name in names:
                for batch in batches[:WARM_UP_BATCHES]:
                    sides[name].embed(batch)
            for r in range(rounds):
                for i, batch in enumerate(batches):
                    k = (r + i) % len(names)
                    for name in names[k:] + names[:k]:
                        time.sleep(PAUSE_S)
                        t0 = time.perf_counter()
                        sides[name].embed(batch)
                        spent[name] += time.perf_counter() - t0
            tps = {name: n * rounds / t for name, t in spent.items()}
            vs_onnx = spent["embedder_rs"] / spent["onnx"]
            vs_torch = spent["embedder_rs"] / spent["torch"] if with_torch else float("nan")
            results[f"{kind}/b{bs}"] = {**tps, "ratio_vs_onnx": vs_onnx, "ratio_vs_torch": vs_torch}
            rows.append(
                [
                    kind,
                    bs,
                    f"{np.mean(tokens[:n]):.0f}",
                    f"{tps['embedder_rs']:,.1f}",
                    f"{tps['onnx']:,.1f}",
                    f"{tps['torch']:,.1f}" if with_torch else "-",
                    f"{vs_onnx:.2f}",
                    f"{vs_torch:.2f}" if with_torch else "-",
                ]
            )
    return rows


def run(
    rounds: int = 3,
    threads: int | None = None,
    model_dir: str | None = None,
    with_torch: bool = True,
) -> tuple[dict, str]:
    threads = threads or len(os.sched_getaffinity(0))
    model_dir = model_dir or os.environ.get("RAGPLANE_MODEL_DIR") or None
    # embedder_rs sizes its rayon pool on first use, from this variable.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    try:
        from server.embedding.rust import RustEmbedder

        rust = RustEmbedder(model_dir, device="cpu")
    except ValueError as exc:
        return {"skipped": str(exc)}, f"Skipped: {exc}."
    import torch

    from server.embedding.onnx import OnnxEmbedder
    from server.embedding.st import SentenceTransformersEmbedder

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_embedder_rs import _passages, _short_texts

    torch.set_num_threads(threads)
    sides = {
        "embedder_rs": rust,
        "onnx": OnnxEmbedder(model_dir, device="cpu", threads=threads),
    }
    if with_torch:
        sides["torch"] = SentenceTransformersEmbedder(model_dir, device="cpu")
    n_max = max(TEXTS_PER_BATCH_SIZE.values())
    corpora = {
        "short": _short_texts(n_max),
        "passage_170": _passages(n_max, rust.count_tokens),
        "passage_250": _passages(n_max, rust.count_tokens, target=250),
    }
    for texts in corpora.values():  # warm-up: lazy inits, first allocations
        for e in sides.values():
            e.embed(texts[:32])
    agree = float(
        np.min(
            np.sum(
                rust.embed(corpora["passage_170"]) * sides["onnx"].embed(corpora["passage_170"]),
                axis=1,
            )
        )
    )
    results: dict = {"min_cosine_rust_vs_onnx": agree, "threads": threads}
    rows = _measure(sides, corpora, rounds, results)
    worst = max(v["ratio_vs_onnx"] for k, v in results.items() if "/" in k)
    results["max_ratio_vs_onnx"] = worst
    md = table(
        [
            "texts",
            "batch",
            "tokens",
            "embedder_rs texts/s",
            "onnx texts/s",
            "torch texts/s",
            "ratio vs onnx (G2)",
            "ratio vs torch",
        ],
        rows,
    )
    md += (
        f"\n\nRatio = embedder_rs time / canonical time on the same batches ({rounds} rounds, "
        f"order rotating, each call after a {PAUSE_S * 1000:.0f} ms pause so that neither "
        f"runs beside the other's idle pool, {threads} threads each). Worst ratio against "
        f"the service's CPU canonical (onnx): {worst:.2f} (gate <= 1.05). "
        f"embedder_rs backend: {rust.device}. "
        f"Minimum cosine embedder_rs vs onnx on the passages: {agree:.7f}."
    )
    return results, md


def main() -> int:
    p = argparse.ArgumentParser(description="bench section 4 alone: embedder_rs vs canonical")
    p.add_argument("--threads", type=int, default=None, help="threads for every embedder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--model-dir", default=None, help="default: RAGPLANE_MODEL_DIR, the package")
    p.add_argument("--no-torch", action="store_true", help="leave torch out (saves time)")
    args = p.parse_args()
    results, md = run(args.rounds, args.threads, args.model_dir, not args.no_torch)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
