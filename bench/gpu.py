"""The canonical on CUDA and the wgpu shadow beside it, on held-out text (issue 18).

    python -m bench.gpu [--device cuda] [--out DIR] [--quick]

Paths, all on the same batches, interleaved (the order rotates per batch):
- `old`: plain SentenceTransformer.encode, fp32 (what the service ran before);
- `new32` / `new16`: SentenceTransformersEmbedder's pipelined path in fp32 / fp16;
- `rs`: embedder_rs on wgpu (Vulkan); `--device cpu` (the dry run) takes its CPU backend.
Short texts (docstring first lines) and ~250-token passages (pydoc topics), batch 1/32/256;
texts/s per path and the time ratio rs / canonical on identical batches. Then parity, where
the time goes for passages at batch 256, and the served gRPC Embed path under concurrent
clients when the server can start here. Each phase has a deadline and fails on its own;
results go to DIR/gpu_bench.json and DIR/gpu_bench.md (DIR: --out, else $OUT, else
bench/out), and the markdown is printed last.
"""

from __future__ import annotations

import os

# before anything imports tokenizers: the CPU benchmarks turn its parallelism off, and
# tokenisation is on the GPU path's critical path (GPU.md: a third slower without it)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402


class Deadline(Exception):
    pass


#: called after every phase, so a run killed from outside still leaves what it measured
_SAVE: Callable[[dict[str, Any]], None] | None = None


class Phase:
    """One phase's result: ok / partial / skipped / failed, with its reason and numbers."""

    def __init__(self, name: str, seconds: float, report: dict[str, Any]) -> None:
        self.name, self.seconds, self.report = name, seconds, report
        self.t0 = time.perf_counter()
        self.data: dict[str, Any] = {}
        report[name] = {"status": "running", "data": self.data}

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def check(self) -> None:
        if self.left() <= 0:
            raise Deadline(f"phase {self.name} ran past its {self.seconds:.0f} s deadline")

    def __enter__(self) -> Phase:
        print(f"== {self.name} (deadline {self.seconds:.0f} s)", flush=True)
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        entry = self.report[self.name]
        entry["seconds"] = round(time.perf_counter() - self.t0, 1)
        if exc is None:
            entry["status"] = "ok"
        elif isinstance(exc, Deadline):
            entry["status"], entry["reason"] = "partial", str(exc)
        elif isinstance(exc, Skip):
            entry["status"], entry["reason"] = "skipped", str(exc)
        else:
            entry["status"] = "failed"
            entry["reason"] = f"{kind.__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
        print(f"   {entry['status']} in {entry['seconds']} s {entry.get('reason', '')}", flush=True)
        if _SAVE is not None:
            _SAVE(self.report)
        return True  # every phase fails on its own


class Skip(Exception):
    pass


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def _model_dir(given: str) -> Path:
    if given or os.environ.get("RAGPLANE_MODEL_DIR"):
        return Path(given or os.environ["RAGPLANE_MODEL_DIR"])
    from ragplane.server.embedding.model_files import default_model_dir

    return default_model_dir()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


@dataclass
class _Run:
    """What the phases of one run share: the paths under test and their inputs."""

    args: argparse.Namespace
    report: dict[str, Any]
    model_dir: Path
    paths: dict[str, Callable[[list[str]], np.ndarray]] = field(default_factory=dict)
    objs: dict[str, Any] = field(default_factory=dict)
    corpora: dict[str, list[str]] = field(default_factory=dict)

    def unpack(self) -> tuple:
        n_big = max(max(self.args.batches) * self.args.batches_per_cell, 64)
        a = self.args
        return a, self.report, self.paths, self.objs, self.corpora, a.device, self.model_dir, n_big


def run_phases(args: argparse.Namespace, report: dict[str, Any] | None = None) -> dict[str, Any]:
    report = {} if report is None else report
    run = _Run(args, report, _model_dir(args.model_dir))
    _phase_environment(run)
    _phase_load(run)
    if not run.paths:
        return report
    for phase in (_phase_parity, _phase_throughput, _phase_token_budget, _phase_breakdown):
        phase(run)
    _phase_served(run)
    return report


def _phase_environment(run: _Run) -> None:
    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("environment", 60, report) as ph:
        import tokenizers
        import torch
        import transformers

        ph.data.update(
            python=platform.python_version(),
            torch=torch.__version__,
            transformers=transformers.__version__,
            tokenizers=tokenizers.__version__,
            cpu_cores=os.cpu_count(),
            device=dev,
            model_dir=str(model_dir),
            date=time.strftime("%Y-%m-%d", time.gmtime()),
        )
        if dev.startswith("cuda"):
            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda but torch sees no CUDA device")
            ph.data["gpu"] = torch.cuda.get_device_name(0)
            ph.data["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))


def _phase_load(run: _Run) -> None:
    from bench.bench_embedder_rs import _passages, _short_texts

    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("load", args.phase_seconds, report) as ph:
        import sentence_transformers
        from sentence_transformers import SentenceTransformer

        from ragplane.server.embedding.st import SentenceTransformersEmbedder

        ph.data["sentence_transformers"] = sentence_transformers.__version__
        old = SentenceTransformer(str(model_dir), device=dev, local_files_only=True)
        old.max_seq_length = 256
        objs["old"] = old
        paths["old"] = lambda b: old.encode(
            b, batch_size=len(b), normalize_embeddings=True, convert_to_numpy=True
        )
        for key, half in (("new32", False), ("new16", True)):
            e = SentenceTransformersEmbedder(model_dir, dev, 256, half=half, pipelined=True)
            objs[key] = e
            paths[key] = e.embed
            ph.data[f"{key}_precision"] = e.precision
            ph.data[f"{key}_g1_min_cosine"] = e._fast.g1_min_cosine
        ph.check()
        try:
            import embedder_rs

            embedder_rs.Embedder  # noqa: B018
            backend = "wgpu" if dev.startswith("cuda") else "cpu"
            t0 = time.perf_counter()
            rs = embedder_rs.Embedder(model_dir, backend=backend, max_seq_length=256)
            ph.data["rs_load_s"] = round(time.perf_counter() - t0, 2)
            ph.data["rs"] = f"{rs.backend}:{rs.adapter} embedder_rs {embedder_rs.__version__}"
            objs["rs"] = rs
            paths["rs"] = lambda b: np.asarray(rs.embed(b, normalize=True))
        except Exception as exc:  # the canonical numbers still count without the shadow
            ph.data["rs"] = f"unavailable: {type(exc).__name__}: {exc}"
        counter = objs["new32"].count_tokens
        corpora["short"] = _short_texts(n_big)
        corpora["passages"] = _passages(n_big, counter, target=250)
        if not corpora["passages"]:
            raise RuntimeError("no passages could be cut from pydoc_data.topics")
        corpora["passages"] = (corpora["passages"] * (n_big // len(corpora["passages"]) + 1))[
            :n_big
        ]
        for kind, texts in corpora.items():
            tokens = counter(texts)
            ph.data[f"{kind}_tokens_mean"] = round(float(np.mean(tokens)), 1)
        for fn in paths.values():  # warm-up at every batch size timed: a shape's first call
            for texts in corpora.values():  # (autotuning, plans) costs more than a small cell
                for b in sorted({1, 256, *args.batches}):
                    fn(texts[:b])


def _phase_parity(run: _Run) -> None:
    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("parity", args.phase_seconds, report) as ph:
        texts = corpora["short"][:512] + corpora["passages"][:512]
        ref = paths["new32"](texts)
        for key in ("new16", "old", "rs"):
            if key in paths:
                c = _cos(paths[key](texts), ref)
                ph.data[f"{key}_vs_new32"] = {
                    "n": len(texts),
                    "min": float(c.min()),
                    "mean": float(c.mean()),
                }
                ph.check()


def _phase_throughput(run: _Run) -> None:
    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("throughput", args.throughput_seconds, report) as ph:
        keys = list(paths)
        per_cell = args.throughput_seconds / (2 * len(args.batches))
        for kind in ("short", "passages"):
            for b in args.batches:
                cell = {k: 0.0 for k in keys}
                done = 0
                t_cell = time.perf_counter()
                # at least 64 texts, so batch 1 is not 8 samples of noise
                texts = corpora[kind][: max(b * args.batches_per_cell, 64)]
                for i in range(0, len(texts), b):
                    batch = texts[i : i + b]
                    order = keys[i // b % len(keys) :] + keys[: i // b % len(keys)]
                    for k in order:
                        t0 = time.perf_counter()
                        paths[k](batch)
                        cell[k] += time.perf_counter() - t0
                    done += len(batch)
                    if time.perf_counter() - t_cell > per_cell and i // b >= 2:
                        break  # enough batches for this cell inside its share of time
                    ph.check()
                row: dict[str, Any] = {"texts": done}
                for k in keys:
                    row[f"{k}_texts_s"] = round(done / cell[k], 1)
                if "rs" in keys:
                    for c in ("old", "new32", "new16"):
                        row[f"ratio_rs_{c}"] = round(cell["rs"] / cell[c], 3)
                ph.data[f"{kind}_b{b}"] = row
                print(f"   {kind} b{b}: {row}", flush=True)


def _phase_token_budget(run: _Run) -> None:
    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("token_budget", args.phase_seconds / 2, report) as ph:
        e = objs["new16"]
        texts = corpora["passages"][: max(args.batches) * args.batches_per_cell]
        big = max(args.batches)
        keep = e._fast.token_budget
        try:
            for budget in (8192, 16384, 32768, 65536):
                e._fast.token_budget = budget
                e.embed(texts[:big])
                t0 = time.perf_counter()
                for i in range(0, len(texts), big):
                    e.embed(texts[i : i + big])
                ph.data[str(budget)] = round(len(texts) / (time.perf_counter() - t0), 1)
                ph.check()
        finally:
            e._fast.token_budget = keep


def _phase_breakdown(run: _Run) -> None:
    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("breakdown", args.phase_seconds, report) as ph:
        big = max(args.batches)
        texts = corpora["passages"][: big * args.batches_per_cell]
        rows = np.arange(len(texts))
        for key in ("new32", "new16"):
            fast = objs[key]._fast
            t0 = time.perf_counter()
            chunks = []
            for i in range(0, len(texts), big):
                chunks += fast.tokenise(texts, rows[i : i + big])
            t_tok = time.perf_counter() - t0
            real = sum(int(c.mask.sum()) for c in chunks)
            padded = sum(c.mask.numel() for c in chunks)
            import torch

            with torch.inference_mode():
                fast._forward(fast._model, chunks[0], True)
                _sync(dev)
                t0 = time.perf_counter()
                for c in chunks:
                    fast._forward(fast._model, c, True)
                _sync(dev)
                t_fwd = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(0, len(texts), big):
                objs[key].embed(texts[i : i + big])
            t_e2e = time.perf_counter() - t0
            ph.data[key] = {
                "texts": len(texts),
                "tokenise_texts_s": round(len(texts) / t_tok, 1),
                "forward_texts_s": round(len(texts) / t_fwd, 1),
                "end_to_end_texts_s": round(len(texts) / t_e2e, 1),
                "tokens_s_end_to_end": round(real / t_e2e),
                "padding_waste": round(padded / real, 3),
                "chunks": len(chunks),
            }
            ph.check()
        old = objs["old"]
        t0 = time.perf_counter()
        tokenize = getattr(old, "preprocess", None) or old.tokenize  # renamed in 6.x
        for i in range(0, len(texts), big):
            tokenize(texts[i : i + big])
        ph.data["old_tokenise_texts_s"] = round(len(texts) / (time.perf_counter() - t0), 1)


def _phase_served(run: _Run) -> None:
    args, report, paths, objs, corpora, dev, model_dir, n_big = run.unpack()
    with Phase("served", args.phase_seconds, report) as ph:
        try:
            import ragplane.server.app  # noqa: F401  (faiss, grpc health and reflection)
        except ImportError as exc:
            raise Skip(f"the server cannot start here: {exc}") from None
        from bench.common import run_concurrent
        from ragplane.testkit.harness import InProcessServer
        from ragplane.v1 import embed_pb2

        e = objs["new16"]
        texts = corpora["passages"][: max(args.batches) * args.batches_per_cell]
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            srv = InProcessServer(
                Path(tmp) / "d",
                embedder=e,
                embedder_name="sentence-transformers",
                batch_max_tokens=65536,
                max_batch_texts=4096,
            )
            try:
                for per_call, conc in ((32, 16), (32, 64), (256, 8)):
                    reqs = [texts[i : i + per_call] for i in range(0, len(texts), per_call)]
                    stub = srv.stubs.embed

                    def call(batch, stub=stub):
                        return stub.Embed(embed_pb2.EmbedRequest(texts=batch), timeout=120)

                    call(reqs[0])
                    load = run_concurrent(call, reqs, conc)
                    ph.data[f"{per_call}x{conc}"] = {
                        "texts_s": round(len(texts) / load.seconds, 1),
                        "p50_ms": round(load.p(0.5) * 1000, 1),
                        "p99_ms": round(load.p(0.99) * 1000, 1),
                    }
                    ph.check()
            finally:
                srv.stop()
        ref = report.get("throughput", {}).get("data", {}).get(f"passages_b{max(args.batches)}")
        if ref and "new16_texts_s" in ref:
            best = max(v["texts_s"] for v in ph.data.values() if isinstance(v, dict))
            ph.data["served_over_in_process_new16"] = round(best / ref["new16_texts_s"], 3)


def markdown(report: dict[str, Any]) -> str:
    env = report.get("environment", {}).get("data", {})
    load = report.get("load", {}).get("data", {})
    lines = [
        f"GPU benchmark, {env.get('date', '?')}: {env.get('gpu', env.get('device', '?'))}, "
        f"{env.get('cpu_cores', '?')} cores, Python {env.get('python', '?')}, torch "
        f"{env.get('torch', '?')}, transformers {env.get('transformers', '?')}; new32 = "
        f"{load.get('new32_precision', '?')}, new16 = {load.get('new16_precision', '?')} "
        f"(load-time G1 min cos {load.get('new16_g1_min_cosine')}); rs = {load.get('rs', '?')}",
        "",
        "| texts / batch | old encode fp32 | new fp32 | new fp16 | embedder_rs | "
        "ratio rs/old | rs/new fp32 | rs/new fp16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    tp = report.get("throughput", {}).get("data", {})
    for cell, row in tp.items():
        vals = [row.get(f"{k}_texts_s", "") for k in ("old", "new32", "new16", "rs")]
        rat = [row.get(f"ratio_rs_{k}", "") for k in ("old", "new32", "new16")]
        lines.append(
            f"| {cell} | "
            + " | ".join(f"{v:,}" if v != "" else "" for v in vals)
            + " | "
            + " | ".join(str(r) for r in rat)
            + " |"
        )
    par = report.get("parity", {}).get("data", {})
    if par:
        lines += ["", "| parity vs new fp32 | n | min cos | mean cos |", "|---|---|---|---|"]
        for k, v in par.items():
            lines.append(f"| {k} | {v['n']} | {v['min']:.8f} | {v['mean']:.8f} |")
    bd = report.get("breakdown", {}).get("data", {})
    if bd:
        lines += [
            "",
            "| passages b256 | tokenise texts/s | forward texts/s | end to end texts/s | "
            "tokens/s | padding |",
            "|---|---|---|---|---|---|",
        ]
        for k in ("new32", "new16"):
            if k in bd:
                v = bd[k]
                lines.append(
                    f"| {k} | {v['tokenise_texts_s']:,} | {v['forward_texts_s']:,} | "
                    f"{v['end_to_end_texts_s']:,} | {v['tokens_s_end_to_end']:,} | "
                    f"{v['padding_waste']} |"
                )
        if "old_tokenise_texts_s" in bd:
            lines.append(f"| old tokenize (encode's) | {bd['old_tokenise_texts_s']:,} | | | | |")
    tb = report.get("token_budget", {}).get("data", {})
    if tb:
        lines += [
            "",
            "new fp16 passages b256 by token budget (texts/s): "
            + ", ".join(f"{k}: {v:,}" for k, v in tb.items()),
        ]
    sv = report.get("served", {}).get("data", {})
    if sv:
        lines += ["", "served gRPC Embed (passages, per call x clients): " + json.dumps(sv)]
    lines += ["", "| phase | status | s | reason |", "|---|---|---|---|"]
    for name, entry in report.items():
        reason = str(entry.get("reason", "")).replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {name} | {entry['status']} | {entry.get('seconds', '')} | {reason} |")
    return "\n".join(lines)


def run() -> tuple[dict[str, Any], str]:
    """`python -m bench --only gpu`: the same phases with default settings, on CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}, "Skipped: torch sees no CUDA device."
    report = run_phases(_parser().parse_args([]))
    return report, markdown(report)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model-dir", default="")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/out")
    p.add_argument("--batches", default="1,32,256", type=lambda v: [int(b) for b in v.split(",")])
    p.add_argument("--batches-per-cell", type=int, default=8)
    p.add_argument("--phase-seconds", type=float, default=60.0)
    p.add_argument("--throughput-seconds", type=float, default=120.0)
    p.add_argument("--quick", action="store_true", help="dry run: tiny batches and deadlines")
    return p


def main() -> int:
    args = _parser().parse_args()
    if args.quick:
        args.batches = [1, 4, 8]
        args.batches_per_cell = 2
        args.phase_seconds = min(args.phase_seconds, 60.0)
        args.throughput_seconds = min(args.throughput_seconds, 60.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    global _SAVE

    def save(report: dict[str, Any]) -> str:
        (out / "gpu_bench.json").write_text(json.dumps(report, indent=2, default=str))
        md = markdown(report)
        (out / "gpu_bench.md").write_text(md + "\n")
        return md

    _SAVE = save
    report: dict[str, Any] = {}
    try:
        run_phases(args, report)
    except BaseException:  # KeyboardInterrupt too: `timeout -s INT` ends an overlong run
        report["run"] = {"status": "failed", "reason": traceback.format_exc()[-3000:]}
    print("\n" + save(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
