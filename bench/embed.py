"""1. Embed over gRPC at concurrency 1, 8, 32 (one text per call) against in-process
encode of the same texts. Dynamic batching is what lets many small calls keep up.

The goal's baseline is `SentenceTransformer.encode` in-process (batches of 32); the
in-process run of the server's own embedder (`embedder = auto`: ONNX on a CPU) is shown
beside it. Both baselines are timed before and after the server runs and averaged, so a
drift in the machine's speed during the run does not land on one side only.
"""

from __future__ import annotations

from bench.common import run_concurrent, start_server, table
from ragplane.testkit.texts import sentences
from ragplane.v1 import embed_pb2, embed_pb2_grpc

N_TEXTS = 384


def _in_process(embedders: dict, texts: list[str]) -> dict[str, float]:
    batches = [texts[i : i + 32] for i in range(0, len(texts), 32)]
    return {
        name: len(texts) / run_concurrent(lambda b, e=e: e.embed(b), batches, 1).seconds
        for name, e in embedders.items()
    }


def run(embedder: str = "auto") -> tuple[dict, str]:
    from ragplane.server.embedding import load_embedder

    texts = list(sentences())[:N_TEXTS]
    local = {
        "encode": load_embedder("sentence-transformers", device="cpu"),
        "serving": load_embedder(embedder, device="cpu"),
    }
    for e in local.values():
        e.embed(texts[:32])  # warm-up
    before = _in_process(local, texts)
    srv = start_server(f"embedder={embedder}", "koder_toml=", "device=cpu")
    loads = {}
    try:
        stub = embed_pb2_grpc.EmbedServiceStub(srv.channel())
        stub.Embed(embed_pb2.EmbedRequest(texts=texts[:8]))
        for c in (1, 8, 32):
            loads[c] = run_concurrent(
                lambda t: stub.Embed(embed_pb2.EmbedRequest(texts=[t])), texts, c
            )
        serving = local["serving"].identity
    finally:
        srv.stop()
    after = _in_process(local, texts)
    base = {k: (before[k] + after[k]) / 2 for k in before}
    results: dict = {
        "encode_texts_per_s": base["encode"],
        "serving_in_process_texts_per_s": base["serving"],
        "serving": serving,
    }
    rows = []
    for c, load in loads.items():
        ratio = load.per_second / base["encode"]
        results[f"c{c}"] = {
            "texts_per_s": load.per_second,
            "ratio_vs_encode": ratio,
            "ratio_vs_serving_in_process": load.per_second / base["serving"],
            "p50_ms": load.p(0.5) * 1e3,
            "p99_ms": load.p(0.99) * 1e3,
        }
        rows.append(
            [
                c,
                f"{load.per_second:,.1f}",
                f"{base['encode']:,.1f}",
                f"{ratio:.2f}x",
                f"{base['serving']:,.1f}",
                f"{load.per_second / base['serving']:.2f}x",
                f"{load.p(0.5) * 1e3:.1f}",
                f"{load.p(0.99) * 1e3:.1f}",
            ]
        )
    md = table(
        [
            "concurrency",
            "gRPC texts/s",
            "in-process encode texts/s",
            "ratio (goal)",
            f"in-process {serving} texts/s",
            "ratio",
            "p50 ms",
            "p99 ms",
        ],
        rows,
    )
    md += (
        f"\n\nServer embedder: {serving}. In-process baselines in batches of 32, timed before "
        f"and after the server run: encode {before['encode']:,.1f} / {after['encode']:,.1f}, "
        f"{serving} {before['serving']:,.1f} / {after['serving']:,.1f} texts/s."
    )
    return results, md
