"""`python -m bench.aa_floor`: G2's two timing floors (A/A: the canonical after the shadow
against before it; B/B: the shadow after the canonical against before it) on real text,
with the service's embedders in this process and nothing else running, against what ran
just before each timed batch.

G2 times canonical-shadow-canonical and shadow-canonical-shadow batches in turn
(server.shadow.timing); its timings "prove nothing" when A/A lies above B/B by more than
`max_aa_ratio`, the sign of the shadow slowing the canonical after it. In the service a
sample is taken right after the canonical served the request, so the embedder that ran
first in each timed batch did or did not have a warm start. This separates the two causes:

  * ``cold``: each batch after a pause of `--pause-ms` (both embedders' threads asleep);
  * ``after-canonical``: each batch right after the canonical embedded other texts, as the
    service's sampler sees it before a flip;
  * ``after-shadow``: the same after the shadow, as the watch sees it after a flip.

If the shadow itself slowed the canonical, A/A would exceed B/B in every setting; if the
warm start is the cause, the asymmetry follows what ran before. Modes are interleaved batch
by batch, so drift hits each alike.

    python -m bench.aa_floor [--batches 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

from ragplane.server.shadow.hardware import cpu_extension
from ragplane.server.shadow.timing import estimate, run_interleaved
from ragplane.testkit.texts import long_passages, sentences, topic_passages

MODES = ("cold", "after-canonical", "after-shadow")


def measure(batches: int, pause_ms: float, batch: int = 8) -> dict:
    from ragplane.server.embedding.onnx import OnnxEmbedder
    from ragplane.server.embedding.rust import RustEmbedder

    canonical, shadow = OnnxEmbedder(device="cpu"), RustEmbedder(device="cpu")
    pools = {
        "short": [t for t in sentences() if len(t.split()) <= 15],
        "medium": [t for t in topic_passages() if 40 <= len(t.split()) <= 90],
        "window": long_passages(min_words=200),
    }
    results: dict = {
        "cpu": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"{cpu_extension()}",
        "canonical": canonical.identity,
        "shadow": shadow.identity,
        "pause_ms": pause_ms,
        "rows": [],
    }
    for cls, pool in pools.items():
        for e in (canonical, shadow):  # warm-up
            e.embed(pool[:batch])
        timings: dict[str, list] = {m: [] for m in MODES}
        for i in range(batches):
            texts = pool[(i * batch) % (len(pool) - batch) :][:batch]
            before = pool[((i + 7) * batch) % (len(pool) - batch) :][:batch]
            for mode in MODES:
                if mode == "cold":
                    time.sleep(pause_ms / 1000)
                else:
                    (canonical if mode == "after-canonical" else shadow).embed(before)
                *_, t = run_interleaved(canonical, shadow, texts, i % 2 == 1, 0.0)
                timings[mode].append(t)
        for mode in MODES:
            t = estimate(timings[mode])
            results["rows"].append(
                {
                    "class": cls,
                    "mode": mode,
                    "aa": t.aa,
                    "bb": t.bb,
                    "ratio": t.ratio,
                    "upper95": t.upper,
                    "asym_low": t.asym_low,
                    "batches": t.batches,
                }
            )
    return results


def report(r: dict) -> str:
    lines = [
        f"{r['shadow']} vs {r['canonical']}, {r['cpu']}; 8 texts per batch, both orders "
        f"alternating, modes interleaved (cold: {r['pause_ms']:g} ms pause first):",
        "",
        "| class | before each batch | A/A | B/B | A/A / B/B | its lower 95% | G2 ratio | "
        "upper 95% | batches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        asym = x["aa"] / x["bb"] if x["aa"] > 0 and x["bb"] > 0 else 0.0
        low = math.exp(x["asym_low"]) if math.isfinite(x["asym_low"]) else 0.0
        lines.append(
            f"| {x['class']} | {x['mode']} | {x['aa']:.3f} | {x['bb']:.3f} | {asym:.3f} | "
            f"{low:.3f} | {x['ratio']:.3f} | {x['upper95']:.3f} | {x['batches']} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.aa_floor", description=__doc__)
    p.add_argument("--batches", type=int, default=60, help="timed batches per class and mode")
    p.add_argument("--pause-ms", type=float, default=50.0, help="the cold mode's pause")
    p.add_argument("--json", default="", help="also write the numbers here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    r = measure(args.batches, args.pause_ms)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
