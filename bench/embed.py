"""1. Embed over gRPC at concurrency 1, 8, 32 (one text per call) against in-process
encode of the same texts. Dynamic batching is what lets many small calls keep up."""

from __future__ import annotations

from bench.common import run_concurrent, start_server, table
from ragplane.v1 import embed_pb2, embed_pb2_grpc
from tests.texts import sentences

N_TEXTS = 384


def run(embedder: str = "auto") -> tuple[dict, str]:
    from server.embedding import load_embedder

    texts = list(sentences())[:N_TEXTS]
    local = load_embedder(embedder, device="cpu")
    local.embed(texts[:32])  # warm-up
    inproc = run_concurrent(
        lambda b: local.embed(b), [texts[i : i + 32] for i in range(0, N_TEXTS, 32)], 1
    )
    inproc_tps = N_TEXTS / inproc.seconds
    srv = start_server(f"embedder={embedder}", "koder_toml=", "device=cpu")
    rows, results = [], {"in_process_texts_per_s": inproc_tps, "embedder": embedder}
    try:
        stub = embed_pb2_grpc.EmbedServiceStub(srv.channel())
        stub.Embed(embed_pb2.EmbedRequest(texts=texts[:8]))
        for c in (1, 8, 32):
            load = run_concurrent(lambda t: stub.Embed(embed_pb2.EmbedRequest(texts=[t])), texts, c)
            ratio = load.per_second / inproc_tps
            results[f"c{c}"] = {
                "texts_per_s": load.per_second,
                "ratio": ratio,
                "p50_ms": load.p(0.5) * 1e3,
                "p99_ms": load.p(0.99) * 1e3,
            }
            rows.append(
                [
                    c,
                    f"{load.per_second:,.1f}",
                    f"{inproc_tps:,.1f}",
                    f"{ratio:.2f}x",
                    f"{load.p(0.5) * 1e3:.1f}",
                    f"{load.p(0.99) * 1e3:.1f}",
                ]
            )
    finally:
        srv.stop()
    md = table(
        ["concurrency", "gRPC texts/s", "in-process texts/s", "ratio", "p50 ms", "p99 ms"], rows
    )
    return results, md
