"""`python -m bench.aa_floor`: the A/A floor of G2's A/B/A timing, against the pause before
each timed run.

G2 times canonical, shadow, canonical on the same texts; a run whose A/A floor
(canonical after / canonical before) lies outside `max_aa_ratio` proves nothing. In the
service that floor sat at ~1.10 on 2 cores: the canonical ran slower right after the
shadow. This measures, on real text with the service's embedders (ONNX Runtime and
embedder_rs on the CPU), the floor and the two G2 estimates (server.shadow.timing) for
each pause setting, interleaved round by round, so the `timing_pause_ms` default rests on a
measurement. Nothing else should run on the machine meanwhile.

    python -m bench.aa_floor [--pauses 0,2,10,50] [--batches 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from ragplane.server.shadow.hardware import cpu_extension
from ragplane.server.shadow.timing import estimate
from ragplane.testkit.texts import long_passages, sentences


def _aba(canonical, shadow, texts: list[str], pause: float) -> tuple[float, float, float]:
    """The manager's A/B/A (server.shadow.manager `_aba`), each run after `pause` s."""
    out = []
    for e in (canonical, shadow, canonical):
        time.sleep(pause)
        t0 = time.perf_counter()
        e.embed(texts, normalize=False)
        out.append(time.perf_counter() - t0)
    return out[0], out[1], out[2]


def measure(pauses_ms: list[float], batches: int, batch: int = 8) -> dict:
    from ragplane.server.embedding.onnx import OnnxEmbedder
    from ragplane.server.embedding.rust import RustEmbedder

    canonical, shadow = OnnxEmbedder(device="cpu"), RustEmbedder(device="cpu")
    pools = {
        "short": [t for t in sentences() if len(t.split()) <= 15],
        "window": long_passages(min_words=200),
    }
    results: dict = {
        "cpu": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"{cpu_extension()}",
        "kernel": getattr(shadow, "kernel", ""),
        "canonical": canonical.identity,
        "shadow": shadow.identity,
        "rows": [],
    }
    for cls, pool in pools.items():
        for e in (canonical, shadow):  # warm-up
            e.embed(pool[:batch])
        timings: dict[float, list] = {p: [] for p in pauses_ms}
        for i in range(batches):  # pauses interleaved, so drift hits each alike
            texts = pool[(i * batch) % (len(pool) - batch) :][:batch]
            for p in pauses_ms:
                timings[p].append(_aba(canonical, shadow, texts, p / 1000))
        for p in pauses_ms:
            t = estimate(timings[p])
            results["rows"].append(
                {
                    "class": cls,
                    "pause_ms": p,
                    "aa": t.aa,
                    "ratio": t.ratio,
                    "upper95": t.upper,
                    "estimate": t.estimate,
                    "batches": t.batches,
                }
            )
    return results


def report(r: dict) -> str:
    lines = [
        f"{r['shadow']} (kernel {r['kernel'] or '?'}) vs {r['canonical']}, {r['cpu']}; "
        "A/B/A on 8 texts per batch, pauses interleaved:",
        "",
        "| class | pause before each run | A/A floor | G2 ratio | upper 95% | estimate | batches |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['class']} | {x['pause_ms']:g} ms | {x['aa']:.3f} | {x['ratio']:.3f} | "
            f"{x['upper95']:.3f} | {x['estimate']} | {x['batches']} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.aa_floor", description=__doc__)
    p.add_argument("--pauses", default="0,2,10,50", help="ms before each timed run")
    p.add_argument("--batches", type=int, default=40, help="timed batches per class and pause")
    p.add_argument("--json", default="", help="also write the numbers here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    r = measure([float(x) for x in args.pauses.split(",")], args.batches)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
