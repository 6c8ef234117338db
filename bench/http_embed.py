"""14. Embeddings over the OpenAI-compatible HTTP API vs the Embed RPC, on one server.

One `ragplane serve` with the real canonical (onnx, CPU) answers both: gRPC Embed and
`POST /v1/embeddings` (float JSON, and base64 as the official `openai` client asks by
default) meet in the same batcher. One text per call, real passages
(`ragplane.testkit.texts.corpus`), at concurrency 1, 8 and 32. The transports take turns
in short slots (a few seconds: 2 x concurrency texts, at least 16), each on the same texts
within a slot, their order running through every permutation, so the load of a shared
machine falls on all alike; rates pool every slot (all texts / all seconds), and the
ratios of single slots are shown by their median and range.

The clients are as lean as each transport allows, so the server's cost is what differs:
grpcio's stub (the reply parsed into protobuf), and one keep-alive `http.client`
connection per worker thread (the reply parsed with `json`, base64 decoded by numpy).

    python -m bench.http_embed [--rounds R] [--write]
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import statistics
import threading
import time
from http.client import HTTPConnection

import numpy as np

from bench.common import ROOT, Server, run_concurrent, start_server, table
from bench.markdown import replace_block
from ragplane.server.shadow.hardware import cpu_extension, cpu_info
from ragplane.testkit.texts import corpus
from ragplane.v1 import embed_pb2, embed_pb2_grpc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

KEY = "http_embed"
HEADING = "## 14. Embeddings over HTTP (OpenAI-compatible) vs gRPC Embed"
CONCURRENCY = (1, 8, 32)
TRANSPORTS = ("gRPC", "HTTP float", "HTTP base64")


class HttpCaller:
    """`POST /v1/embeddings` of one text, on a keep-alive connection per thread."""

    def __init__(self, port: int, fmt: str) -> None:
        self.port, self.fmt = port, fmt
        self._local = threading.local()

    def __call__(self, text: object) -> np.ndarray:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = HTTPConnection("127.0.0.1", self.port, timeout=120)
        body = {"input": [text], "model": "all-MiniLM-L6-v2", "encoding_format": self.fmt}
        conn.request(
            "POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"}
        )
        reply = conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
        vec = json.loads(data)["data"][0]["embedding"]
        if self.fmt == "base64":
            return np.frombuffer(base64.b64decode(vec), "<f4")
        return np.asarray(vec, np.float32)


def _callers(srv: Server, http_port: int) -> dict:
    stub = embed_pb2_grpc.EmbedServiceStub(srv.channel())
    return {
        "gRPC": lambda t: stub.Embed(embed_pb2.EmbedRequest(texts=[t]), timeout=120),
        "HTTP float": HttpCaller(http_port, "float"),
        "HTTP base64": HttpCaller(http_port, "base64"),
    }


def _check_same_vectors(callers: dict, texts: list[str]) -> float:
    """The least cosine between gRPC's vector and each HTTP format's, over `texts`."""
    least = 1.0
    for t in texts:
        want = np.asarray(callers["gRPC"](t).vectors[0].values, np.float32)
        for name in TRANSPORTS[1:]:
            got = callers[name](t)
            least = min(least, float(want @ got / np.linalg.norm(want) / np.linalg.norm(got)))
    return least


def slot_texts(c: int) -> int:
    """Texts per slot at concurrency `c`: every worker sends two."""
    return max(16, 2 * c)


def measure(rounds: int) -> dict:
    """texts/s per slot, transport and concurrency, on one server."""
    per_round = sum(slot_texts(c) for c in CONCURRENCY)
    texts = corpus(rounds * per_round)
    orders = list(itertools.permutations(TRANSPORTS))
    http_port = _free_port()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    srv = start_server("embedder=onnx", "device=cpu", "koder_toml=", f"http_port={http_port}")
    try:
        callers = _callers(srv, http_port)
        least_cosine = _check_same_vectors(callers, texts[:8])  # and a warm-up of each
        rates: dict[str, dict[int, list[float]]] = {
            name: {c: [] for c in CONCURRENCY} for name in TRANSPORTS
        }
        seconds = {name: dict.fromkeys(CONCURRENCY, 0.0) for name in TRANSPORTS}
        cpu = {name: dict.fromkeys(CONCURRENCY, 0.0) for name in TRANSPORTS}
        at = 0
        for r in range(rounds):
            for i, c in enumerate(CONCURRENCY):
                chunk, at = texts[at : at + slot_texts(c)], at + slot_texts(c)
                for name in orders[(r + i) % len(orders)]:
                    before = srv.cpu_seconds()
                    load = run_concurrent(callers[name], chunk, c)
                    cpu[name][c] += srv.cpu_seconds() - before
                    rates[name][c].append(load.per_second)
                    seconds[name][c] += load.seconds
        tokens = _mean_tokens(srv, texts)
    finally:
        srv.stop()
    return {
        "rates": rates,
        # every transport embedded the same texts: the pooled rate is texts / these
        "seconds": seconds,
        "server_cpu_seconds": cpu,
        "least_cosine": least_cosine,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "took": time.perf_counter() - t0,
        "rounds": rounds,
        "mean_tokens": tokens,
    }


def _mean_tokens(srv: Server, texts: list[str]) -> float:
    """Tokens per text, as the server's tokenizer counts them (after the measurements)."""
    stub = embed_pb2_grpc.EmbedServiceStub(srv.channel())
    counts: list[int] = []
    for i in range(0, len(texts), 64):
        reply = stub.Embed(embed_pb2.EmbedRequest(texts=texts[i : i + 64]), timeout=300)
        counts += reply.token_counts
    return float(np.mean(counts))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def markdown(res: dict) -> str:
    rates, secs, cpu = res["rates"], res["seconds"], res["server_cpu_seconds"]
    rows = []
    for c in CONCURRENCY:
        n = res["rounds"] * slot_texts(c)  # texts each transport sent at this level
        for name in TRANSPORTS:
            ratios = [h / g for h, g in zip(rates[name][c], rates["gRPC"][c], strict=True)]
            vs = (
                f"**{secs['gRPC'][c] / secs[name][c]:.2f}x** ({statistics.median(ratios):.2f}x; "
                f"{min(ratios):.2f}-{max(ratios):.2f})"
            )
            rows.append(
                [
                    c,
                    name,
                    f"{n / secs[name][c]:,.1f}",
                    vs if name != "gRPC" else "",
                    f"{cpu[name][c] / n * 1e3:.1f}",
                    f"{cpu['gRPC'][c] / cpu[name][c]:.2f}x" if name != "gRPC" else "",
                ]
            )
    headers = [
        "concurrency",
        "transport",
        "texts/s",
        "/ gRPC (median; range of slots)",
        "server CPU ms/text",
        "gRPC CPU / this",
    ]
    model, flags = cpu_info()
    ext = {"avx512": "AVX-512", "avx2": "AVX2"}.get(cpu_extension(flags), cpu_extension(flags))
    lb, la = res["load_before"], res["load_after"]
    sizes = ", ".join(f"{slot_texts(c)} at {c}" for c in CONCURRENCY)
    return (
        "Goal: HTTP / gRPC >= 0.9x.\n\n"
        + table(headers, rows)
        + f"\n\nOne text per call (real passages, mean {res['mean_tokens']:.0f} tokens); "
        f"{res['rounds']} slots per transport and concurrency (texts per slot: {sizes}), the "
        "three transports taking turns on the same texts in every order. Rates and the ratios "
        "in bold pool the slots (all texts / all seconds); beside them the median and range "
        "of single slots' ratios. Server CPU is the server process's user + system time per "
        "text (/proc), what each transport costs it whatever else runs. One server (onnx on "
        "CPU, shadow off) answers both transports through the same batcher. Least cosine "
        "between the HTTP and the gRPC vector of a text: "
        f"{res['least_cosine']:.6f}.\n\n"
        f"_Measured {time.strftime('%Y-%m-%d', time.gmtime())} on {os.cpu_count()} cores "
        f"({model or 'unknown CPU'}, {ext}), load average {lb[0]:.2f} before and {la[0]:.2f} "
        f"after (1 min; others' tests and benchmarks share the machine); {res['took']:.0f} "
        "s. `python -m bench.http_embed --write`._"
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_embed", description=__doc__)
    p.add_argument("--rounds", type=int, default=12, help="slots per transport and level")
    p.add_argument("--write", action="store_true", help=f"update BENCHMARKS.md's {KEY} block")
    a = p.parse_args()
    res = measure(a.rounds)
    md = markdown(res)
    print(md)
    out = ROOT / "bench" / "out" / "http_embed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str))
    if a.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_block(path.read_text(), KEY, md, HEADING))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
