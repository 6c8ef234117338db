"""4. embedder_rs against the canonical embedders on the same batches: the G2 ratio.

Three embedders as the service builds them (server.embedding), timed on identical batches
of short texts and ~170- and ~250-token passages at batch 1, 8 and 32, the order rotating
every round so none profits from running first. The service's canonical on a CPU is ONNX
Runtime (`embedder = auto`), so the G2 ratio is embedder_rs time / onnx time; torch is
shown for reference (`bench/bench_embedder_rs.py` is the standalone torch-only version).

Every cell is timed in two regimes, interleaved in one run so both see the same machine:
back to back (each side's calls one right after the other, as in a loaded server running
that embedder) and idle (a 50 ms pause before each call, as a server between requests).
The report states the CPU's vector extensions and the kernel embedder_rs chose;
`EMBEDDER_RS_KERNEL=avx2` measures embedder_rs's AVX2 path on an AVX-512 CPU (against ONNX
Runtime's AVX-512 kernels); `python -m bench.avx2_only python -m bench.rust` measures both
sides as on a CPU without AVX-512.

All three use the same number of threads: the machine's cores, or `--threads N`
(embedder_rs through RAYON_NUM_THREADS, ONNX Runtime's intra-op pool, torch's). Run alone,
on a machine with many cores, without rewriting BENCHMARKS.md:

    python -m bench.rust --threads 16 [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from bench import avx2_only
from bench.markdown import table
from ragplane.server.shadow.hardware import cpu_info

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
# (name in the report, pause before each timed call): a loaded server runs batches back to
# back; an idle one meets each after a gap in which every pool has gone to sleep
REGIMES = (("loaded", 0.0), ("idle", PAUSE_S))
# the flags that say which SIMD paths a CPU has (x86 /proc/cpuinfo "flags", Arm "Features")
VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)


def cpu_description() -> str:
    """The CPU's model and vector extensions, as /proc/cpuinfo gives them (Linux), e.g.
    "Intel(R) Xeon(R) Processor, avx avx2 fma avx512f ..."."""
    model, flags = cpu_info()
    extensions = " ".join(f for f in VECTOR_FLAGS if f in flags) or "none listed"
    return f"{model or platform.processor() or platform.machine()}, {extensions}"


def _time_cell(sides: dict, batches: list, rounds: int) -> dict[str, dict[str, float]]:
    """Seconds each side spent on `batches`, `rounds` times, in each regime. The regimes
    alternate round by round and the order of the sides rotates, so that both regimes, and
    every side, meet the same machine. Loaded: each side runs all the batches back to back
    as one block (a busy server runs one embedder; interleaved, a side's call met the
    other's still-spinning pool, the other's cost, not its own); idle: the sides take turns
    batch by batch, each call after the pause."""
    names = list(sides)
    spent = {regime: dict.fromkeys(names, 0.0) for regime, _ in REGIMES}
    for r in range(rounds):
        for regime, pause in REGIMES if r % 2 == 0 else REGIMES[::-1]:
            if not pause:
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    t0 = time.perf_counter()
                    for batch in batches:
                        sides[name].embed(batch)
                    spent[regime][name] += time.perf_counter() - t0
                    time.sleep(PAUSE_S)  # the next block starts without this one's pool
                continue
            for i, batch in enumerate(batches):
                k = (r + i) % len(names)
                for name in names[k:] + names[:k]:
                    time.sleep(pause)
                    t0 = time.perf_counter()
                    sides[name].embed(batch)
                    spent[regime][name] += time.perf_counter() - t0
    return spent


def _measure(sides: dict, corpora: dict, rounds: int, results: dict) -> list[list]:
    """Time every side on the same batches in both regimes; fills `results`, returns the
    table rows."""
    names = list(sides)
    rust, with_torch = sides["embedder_rs"], "torch" in sides
    rows = []
    for kind, texts in corpora.items():
        tokens = rust.count_tokens(texts)
        for bs in BATCHES:
            n = min(TEXTS_PER_BATCH_SIZE[bs], len(texts))
            batches = [texts[i : i + bs] for i in range(0, n, bs)]
            # untimed, so that no side meets the cell's shapes (arena growth, scratch sizes)
            # or an idle core's wake-up for the first time inside the timing
            for name in names:
                for batch in batches[:WARM_UP_BATCHES]:
                    sides[name].embed(batch)
            spent = _time_cell(sides, batches, rounds)
            row: list = [kind, bs, f"{np.mean(tokens[:n]):.0f}"]
            cell: dict = {}
            for regime, _ in REGIMES:
                took = spent[regime]
                tps = {name: n * rounds / t for name, t in took.items()}
                vs_onnx = took["embedder_rs"] / took["onnx"]
                vs_torch = took["embedder_rs"] / took["torch"] if with_torch else float("nan")
                cell[regime] = {**tps, "ratio_vs_onnx": vs_onnx, "ratio_vs_torch": vs_torch}
                row += [f"{tps['embedder_rs']:,.1f}", f"{tps['onnx']:,.1f}", f"{vs_onnx:.2f}"]
            # the idle regime's numbers stay at the top level, as before both regimes
            results[f"{kind}/b{bs}"] = {**cell["idle"], **cell}
            vs_torch = cell["idle"]["ratio_vs_torch"]
            row.append(f"{vs_torch:.2f}" if with_torch else "-")
            rows.append(row)
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
        from ragplane.server.embedding.rust import RustEmbedder

        rust = RustEmbedder(model_dir, device="cpu")
    except ValueError as exc:
        return {"skipped": str(exc)}, f"Skipped: {exc}."
    import torch

    from ragplane.server.embedding.onnx import OnnxEmbedder
    from ragplane.server.embedding.st import SentenceTransformersEmbedder

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
    cpu = cpu_description()
    emulated = avx2_only.describe()
    if emulated:
        cpu = f"{cpu}; {emulated}"
    results: dict = {
        "min_cosine_rust_vs_onnx": agree,
        "threads": threads,
        "cpu": cpu,
        "kernel": rust.kernel,
        "embedder_rs": rust.version,
    }
    rows = _measure(sides, corpora, rounds, results)
    cells = [v for k, v in results.items() if "/" in k]
    worst = {regime: max(c[regime]["ratio_vs_onnx"] for c in cells) for regime, _ in REGIMES}
    results["max_ratio_vs_onnx"] = max(worst.values())
    results["max_ratio_vs_onnx_by_regime"] = worst
    return results, _markdown(rows, results, rounds, rust.device)


def _markdown(rows: list, results: dict, rounds: int, backend: str) -> str:
    """Section 4's table and the line under it, from `run`'s rows and results."""
    worst, threads, cpu = results["max_ratio_vs_onnx_by_regime"], results["threads"], results["cpu"]
    version, kernel = results["embedder_rs"], results["kernel"]
    agree = results["min_cosine_rust_vs_onnx"]
    md = table(
        [
            "texts",
            "batch",
            "tokens",
            "loaded: embedder_rs texts/s",
            "onnx texts/s",
            "ratio vs onnx (G2)",
            "idle: embedder_rs texts/s",
            "onnx texts/s",
            "ratio vs onnx (G2)",
            "idle: ratio vs torch",
        ],
        rows,
    )
    md += (
        f"\n\nRatio = embedder_rs time / canonical time on the same batches ({rounds} rounds, "
        f"order rotating, {threads} threads each), in two regimes interleaved in this run: "
        f"loaded, each side's calls back to back as one block (a busy server running that "
        f"embedder), and idle, the sides taking turns, each call after a "
        f"{PAUSE_S * 1000:.0f} ms pause (a server between requests). Worst ratio against "
        f"the service's CPU canonical (onnx): {worst['loaded']:.2f} loaded, "
        f"{worst['idle']:.2f} idle (gate <= 1.05). CPU: {cpu}. embedder_rs {version}, "
        f"kernel {kernel or 'unknown'}, backend {backend}. "
        f"Minimum cosine embedder_rs vs onnx on the passages: {agree:.7f}."
    )
    return md


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
