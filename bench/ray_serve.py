"""Embed through the server with its canonical embedder in-process vs on Ray Serve
(`embed_backend = ray_serve`, on a local Ray the server starts itself), on this machine.

On one node Ray Serve adds work (a round trip and serialisation per chunk) and moves the
model into other processes, one single-threaded replica per core where the in-process
server runs one ONNX Runtime session over every core; this measures what that nets out
to on this machine, as it is loaded. The Ray server runs one replica per core
(one CPU each, fixed, so autoscaling's warm-up is not measured). Both servers stay up and
take turns, round by round, on the same texts, so load from elsewhere on the machine
lands on both; the ratio of each round is the Ray rate over the in-process rate of that
round, and the median of the rounds is reported with their range.
`python -m bench.ray_serve` (about 2 minutes); `python -m bench --only ray_serve` writes
its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from bench.common import Server, run_concurrent, start_server, table
from ragplane.testkit.texts import sentences, topic_passages
from ragplane.v1 import embed_pb2, embed_pb2_grpc

ROUNDS = 5
N_SHORT = 96  # per round, one per call at concurrency 32
N_LONG = 32  # per round, in one call


def _round(srv: Server, short: list[str], long: list[str]) -> dict[str, float]:
    """texts/s of one round: single-text calls (the batcher fills the passes), then the
    passages in one call."""
    stub = embed_pb2_grpc.EmbedServiceStub(srv.channel())
    one = run_concurrent(lambda t: stub.Embed(embed_pb2.EmbedRequest(texts=[t])), short, 32)
    many = run_concurrent(lambda b: stub.Embed(embed_pb2.EmbedRequest(texts=b)), [long], 1)
    return {"short": one.per_second, "long": len(long) / many.seconds}


def run() -> tuple[dict, str]:
    cores = os.cpu_count() or 1
    short_all = list(sentences())[: N_SHORT * ROUNDS]
    long = list(topic_passages(max_words=220, min_words=120))[:N_LONG]
    common = ("embedder=onnx", "koder_toml=", "device=cpu")
    ray = (
        "embed_backend=ray_serve",
        f"ray_serve_min_replicas={cores}",
        f"ray_serve_max_replicas={cores}",
        "ray_serve_replica_cpus=1",
    )
    servers = {"in-process": start_server(*common), "ray_serve": start_server(*common, *ray)}
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in servers}
    try:
        devices = {}
        for name, srv in servers.items():
            stub = embed_pb2_grpc.EmbedServiceStub(srv.channel())
            stub.Embed(embed_pb2.EmbedRequest(texts=long))  # warm-up
            devices[name] = stub.Info(embed_pb2.InfoRequest()).device
        for r in range(ROUNDS):
            short = short_all[r * N_SHORT : (r + 1) * N_SHORT]
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                rounds[name].append(_round(servers[name], short, long))
    finally:
        for srv in servers.values():
            srv.stop()
    results: dict = {"rounds": rounds, "devices": devices, "ray_replicas": cores}
    rows = []
    for kind, label in (
        ("short", "short texts, 1 per call, c=32"),
        ("long", "passages, 32 per call"),
    ):
        ratios = [
            b[kind] / a[kind]
            for a, b in zip(rounds["in-process"], rounds["ray_serve"], strict=True)
        ]
        med = {k: statistics.median(x[kind] for x in v) for k, v in rounds.items()}
        results[kind] = {
            "median_texts_per_s": med,
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        rows.append(
            [
                label,
                f"{med['in-process']:,.1f}",
                f"{med['ray_serve']:,.1f}",
                f"{statistics.median(ratios):.2f}x",
                f"{min(ratios):.2f}-{max(ratios):.2f}x",
            ]
        )
    md = table(
        ["load", "in-process texts/s", "ray_serve texts/s", "ratio (median)", "ratio range"],
        rows,
    )
    md += (
        f"\n\nCanonical onnx on CPU behind the same server, batcher and gRPC front; ray_serve: "
        f"a local Ray started by the server, {cores} replicas x 1 CPU ({devices['ray_serve']}), "
        f"HTTP proxy off. {ROUNDS} rounds, the servers taking turns; medians of the rounds."
    )
    return results, md


def main() -> int:
    argparse.ArgumentParser(prog="python -m bench.ray_serve", description=__doc__).parse_args()
    results, md = run()
    print(md)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
