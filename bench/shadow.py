"""3. Shadow overhead: Embed throughput and p50 with the shadow at its default sample rate
(koder.toml) against the shadow off, two servers loaded in alternating rounds."""

from __future__ import annotations

from bench.common import ROOT, run_concurrent, start_server, table
from ragplane.v1 import embed_pb2, embed_pb2_grpc
from testkit.texts import sentences

ROUNDS = 6
PER_ROUND = 96


def run() -> tuple[dict, str]:
    try:
        from embedder_rs import Embedder  # noqa: F401
    except ImportError as exc:
        return {"skipped": str(exc)}, f"Skipped: embedder_rs is not installed ({exc})."
    texts = list(sentences())[: ROUNDS * PER_ROUND]
    on = start_server("embedder=auto", f"koder_toml={ROOT / 'koder.toml'}", "device=cpu")
    off = start_server("embedder=auto", "koder_toml=", "device=cpu")
    stats = {"on": [], "off": []}
    try:
        stubs = {
            k: embed_pb2_grpc.EmbedServiceStub(s.channel()) for k, s in (("on", on), ("off", off))
        }
        for s in stubs.values():
            s.Embed(embed_pb2.EmbedRequest(texts=texts[:8]))
        for r in range(ROUNDS):
            batch = texts[r * PER_ROUND : (r + 1) * PER_ROUND]
            for k in ("on", "off") if r % 2 == 0 else ("off", "on"):
                stats[k].append(
                    run_concurrent(
                        lambda t, s=stubs[k]: s.Embed(embed_pb2.EmbedRequest(texts=[t])), batch, 8
                    )
                )
    finally:
        on.stop()
        off.stop()
    res = {}
    for k, loads in stats.items():
        lat = sorted(x for ld in loads for x in ld.latencies)
        res[k] = {
            "texts_per_s": sum(ld.done for ld in loads) / sum(ld.seconds for ld in loads),
            "p50_ms": lat[len(lat) // 2] * 1e3,
        }
    res["throughput_cost"] = 1 - res["on"]["texts_per_s"] / res["off"]["texts_per_s"]
    res["p50_cost"] = res["on"]["p50_ms"] / res["off"]["p50_ms"] - 1
    md = table(
        ["shadow", "texts/s", "p50 ms"],
        [[k, f"{res[k]['texts_per_s']:,.1f}", f"{res[k]['p50_ms']:.1f}"] for k in ("off", "on")],
    )
    md += (
        f"\n\nCost of the shadow at the default sample rate: "
        f"{res['throughput_cost'] * 100:.1f}% of throughput, p50 {res['p50_cost'] * 100:+.1f}% "
        "(concurrency 8, one text per call, alternating rounds)."
    )
    return res, md
