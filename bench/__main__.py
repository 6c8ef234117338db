"""`python -m bench` (or `make bench`): run the side-by-side benchmarks in one go and write
their measurements into BENCHMARKS.md. Speeds are ratios measured in the same run on the
same machine; absolute numbers depend on the machine (its line in the report says which).

Each section's measurements sit between its markers (bench.markdown); a run rewrites only
those, so analysis written beside them survives every run. Broken markers stop a run
before it measures anything; a section that fails is reported with its traceback and makes
the exit code 1."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback
from pathlib import Path

from bench.markdown import replace_block

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SECTIONS = {
    "embed": (
        "1. Embed over gRPC vs in-process encode",
        "bench.embed",
        "Goal: >= 0.9x at concurrency 32, from dynamic batching.",
    ),
    "search": (
        "2. Search: coalesced vs one FAISS call per request (100,000 items)",
        "bench.search",
        "Goal: >= 5x the one-call-per-request throughput at concurrency 32 on a flat index.",
    ),
    "shadow": (
        "3. Shadow overhead at the default sample rate",
        "bench.shadow",
        "Goal: at most 5% cost.",
    ),
    "rust": (
        "4. embedder_rs vs canonical (the G2 ratio)",
        "bench.rust",
        "The flip gate G2 needs shadow time / canonical time <= 1.05.",
    ),
    "backends": (
        "5. Canonical backends: torch vs onnx",
        "bench.backends",
        "The faster one is the default for the device (`embedder = auto`), "
        "keeping cosine >= 0.99999 to torch.",
    ),
    "memory": ("6. Peak memory with 1,000,000 x 384 vectors", "bench.memory", ""),
    "service": (
        "7. G2 in the service, quiet and loaded (Locust mixed, shadow at sample rate 1.0)",
        "bench.service_g2",
        "G2 needs, in every traffic class with >= 5% of the batches, the time ratio's upper "
        "95% bound <= 1.05 over >= 30 timed batches (A/B/A and B/A/B in turn; the bound and "
        "the A/A floor as in 'How G2 is measured' below), with G1 unchanged (min cosine >= "
        "0.9999, mean >= 0.99999, overlap@10 >= 0.99, no errors). Under load every offered "
        "batch is sampled, skipped busy or dropped, and at least min_busy_share of the busy "
        "ones are sampled.",
    ),
    "gpu": (
        "8. On an NVIDIA GPU: canonical CUDA (encode vs pipelined fp32/fp16) and embedder_rs wgpu",
        "bench.gpu",
        "Goals on an H200: >= 20,000 passages/s and >= 30,000 short texts/s at batch 256 "
        "through the canonical, served gRPC within 0.8x of that, and embedder_rs/canonical "
        "time ratio <= 1.05. Run on the GPU machine by scripts/gpu_check.sh.",
    ),
    "soak": (
        "9. Soak: 10 minutes of Locust mixed, real model, shadow on",
        "bench.soak",
        "Goal: zero failed calls; after warm-up, the process's overhead (RSS less the vectors "
        "it holds for the load) grows < 10% and open files and threads do not grow. Sampled "
        "every 30 s. `make soak` (exit 1 when a goal is missed).",
    ),
    "hybrid": (
        "10. Dense vs lexical (BM25) vs hybrid search: quality and latency",
        "bench.hybrid",
        "Goals: hybrid beats dense and lexical on the mixed labelled set (recall@10, nDCG@10); "
        "hybrid p50 at most 1.5x dense p50 at 100,000 items.",
    ),
    "ingest": (
        "11. Bulk ingest: in-process vs Ray Data on one node, and the scaling model",
        "bench.ingest",
        "Goal: Ray / in-process >= 0.8x on one node (Ray's overhead). `python -m bench.ingest`.",
    ),
    "ray_serve": (
        "12. Embed with the canonical in-process vs on Ray Serve (one node)",
        "bench.ray_serve",
        "What Ray Serve costs on one machine, where it can only add work: the price of "
        "`embed_backend = ray_serve` before it pays off on replicas across nodes and GPUs.",
    ),
    "documents": (
        "13. Long documents: chunked vs not, dense / lexical / hybrid",
        "bench.documents",
        "Goals (issue 24): document-level recall@10 of dense search over chunks >= 0.90 and "
        ">= +0.30 over chunking off; hybrid (default fusion) >= dense, and within 0.05 of "
        "lexical on word-heavy queries. `python -m bench.documents` (10-15 minutes).",
    ),
}
# Only on request (`--only gpu`): on a machine without CUDA it would overwrite a measured
# GPU section with "skipped".
ON_REQUEST = {"gpu", "soak", "documents"}  # the soak takes 10 minutes: `make soak`


def machine() -> str:
    from ragplane.server.shadow.hardware import cpu_model

    return (
        f"{os.cpu_count()} cores ({cpu_model() or platform.processor()}), Python "
        f"{platform.python_version()}, {platform.system()}"
    )


def main() -> int:
    import importlib

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--only",
        default=",".join(k for k in SECTIONS if k not in ON_REQUEST),
        help="comma-separated sections",
    )
    p.add_argument("--out", default="BENCHMARKS.md")
    p.add_argument("--json", default="bench/out/results.json")
    args = p.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    out = Path(args.out)
    for key in chosen:  # broken markers stop the run now, not after an hour of measuring
        _place(_read(out), key, "")
    results, failed = {}, []
    for key in chosen:
        title, module, goal = SECTIONS[key]
        print(f"== {title}", flush=True)
        t0 = time.perf_counter()
        try:
            res, md = importlib.import_module(module).run()
        except Exception:
            failed.append(key)
            res, md = (
                {"error": traceback.format_exc()},
                ("Failed in this run:\n\n```\n" + traceback.format_exc()[-2000:] + "```"),
            )
        took = time.perf_counter() - t0
        print(md, f"\n({took:.0f}s)\n", flush=True)
        results[key] = res
        write_section(out, key, md, took)  # each as it ends: a later crash keeps it
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def section(key: str, md: str, took: float) -> str:
    """What a run writes between section `key`'s markers: its goal, `md`, and when and
    where it was measured."""
    _, _, goal = SECTIONS[key]
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    measured = f"_Measured {stamp} on {machine()}; {took:.0f} s._"
    return "\n\n".join(part for part in (goal, md.strip("\n"), measured) if part)


HEAD = (
    "# Benchmarks\n\nEvery section compares two things side by side in one run on one "
    "machine, so read the ratios; absolute numbers move with the machine and its load.\n\n"
    "Between a section's `<!-- bench:KEY:begin -->` and `<!-- bench:KEY:end -->` markers "
    "(not shown when rendered) is what `python -m bench` (`make bench`) measured; the next "
    "run rewrites it. Everything outside the markers is written by hand (analysis, earlier "
    "measurements, models) and no run touches it.\n"
)


def write_section(out: Path, key: str, md: str, took: float) -> None:
    """Replace section `key`'s measurements in `out` (adding the section if it has none),
    leaving every other byte of the file as it was. Raises ValueError on broken markers."""
    out.write_text(_place(_read(out), key, section(key, md, took)))


def _read(out: Path) -> str:
    return out.read_text() if out.exists() else HEAD


def _place(text: str, key: str, block: str) -> str:
    keys = list(SECTIONS)
    return replace_block(text, key, block, f"## {SECTIONS[key][0]}", keys[keys.index(key) + 1 :])


if __name__ == "__main__":
    raise SystemExit(main())
