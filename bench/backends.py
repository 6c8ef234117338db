"""5. Canonical backends on the same batches, interleaved: torch (sentence-transformers)
against onnx (onnxruntime, exported from the same weights), with their agreement."""

from __future__ import annotations

import time

import numpy as np

from bench.common import table
from ragplane.testkit.texts import long_passages, sentences


def run(rounds: int = 3) -> tuple[dict, str]:
    from ragplane.server.embedding.onnx import OnnxEmbedder
    from ragplane.server.embedding.st import SentenceTransformersEmbedder

    torch_e, onnx_e = SentenceTransformersEmbedder(device="cpu"), OnnxEmbedder(device="cpu")
    cases = {"short": list(sentences())[:64], "long": long_passages()[:32]}
    a = torch_e.embed(cases["short"] + cases["long"])
    b = onnx_e.embed(cases["short"] + cases["long"])
    min_cos = float(np.min(np.sum(a * b, axis=1)))
    results: dict = {"min_cosine": min_cos}
    rows = []
    for kind, texts in cases.items():
        for bs in (1, 8, 32):
            batches = [texts[i : i + bs] for i in range(0, min(len(texts), bs * 4), bs)]
            t = {"torch": 0.0, "onnx": 0.0}
            n = 0
            for r in range(rounds):
                order = (("torch", torch_e), ("onnx", onnx_e))
                for name, e in order if r % 2 == 0 else order[::-1]:
                    t0 = time.perf_counter()
                    for batch in batches:
                        e.embed(batch)
                    t[name] += time.perf_counter() - t0
                n += sum(len(x) for x in batches)
            tps = {k: n / v for k, v in t.items()}
            results[f"{kind}/b{bs}"] = {
                "torch": tps["torch"],
                "onnx": tps["onnx"],
                "onnx_over_torch": tps["onnx"] / tps["torch"],
            }
            rows.append(
                [
                    kind,
                    bs,
                    f"{tps['torch']:,.1f}",
                    f"{tps['onnx']:,.1f}",
                    f"{tps['onnx'] / tps['torch']:.2f}x",
                ]
            )
    md = table(["texts", "batch", "torch texts/s", "onnx texts/s", "onnx speed-up"], rows)
    md += f"\n\nMinimum cosine onnx vs torch over {len(a)} texts: {min_cos:.7f}."
    return results, md
