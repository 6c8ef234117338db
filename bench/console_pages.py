"""The operator's console: how long each page takes to load on a collection of 100,000
items (BENCHMARKS.md, "The operator's console").

One in-process server (the fake embedder: the console's own cost is measured, not a
model's; a real model adds its query embedding, ~5-10 ms on CPU, to the playground) with
API keys on, one collection of N items of text, metadata and 64-dim vectors, and shadow
evidence from a few hundred timed batches. Each page is fetched `--rounds` times over one
keep-alive connection with the admin key's cookie, after one warm-up fetch; the page's
full HTML is read. Prints the p50 and p90 per page (ms) and the HTML's size.

    python -m bench.console_pages [--items 100000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.texts import corpus
from ragplane.v1 import common_pb2, embed_pb2, index_pb2, search_pb2

KEY = "console-bench-admin-0123456789"
KODER = """
[self_hosted.embeddings]
canonical = "fake"
shadow = "fake"
status = "shadow-active"
sample_rate = 1.0
timing_rate = 1.0
"""
QUERY = "the history of the city and its river"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill(srv: InProcessServer, n: int, md: list) -> None:
    texts = corpus(2000)
    rng = np.random.default_rng(0)
    idx = srv.stubs.index
    idx.CreateCollection(index_pb2.CreateCollectionRequest(name="big"), metadata=md)
    step = 2000
    for lo in range(0, n, step):
        vecs = rng.standard_normal((min(step, n - lo), 64)).astype(np.float32)
        items = [
            common_pb2.Item(id=f"item-{lo + i:06d}", text=texts[(lo + i) % len(texts)],
                            vector=v.tolist())
            for i, v in enumerate(vecs)
        ]
        idx.Upsert(index_pb2.UpsertRequest(collection="big", items=items), metadata=md)
    for i in range(0, 400, 4):  # shadow evidence: timed batches for the flip page's charts
        srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts[i : i + 4]), metadata=md)
    srv.runtime.shadow.drain()


def measure(port: int, path: str, rounds: int) -> tuple[float, float, int]:
    conn = HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"cookie": f"ragplane_console={KEY}"}
    times, size = [], 0
    for i in range(rounds + 1):
        t0 = time.perf_counter()
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise SystemExit(f"{path}: {r.status} {body[:300]!r}")
        if i:  # the first is the warm-up
            times.append(time.perf_counter() - t0)
        size = len(body)
    conn.close()
    q = statistics.quantiles(times, n=10)
    return statistics.median(times) * 1e3, q[-1] * 1e3, size


def rpc_search(srv: InProcessServer, mode: str, rounds: int, md: list) -> float:
    """p50 ms of the Search RPC the playground's column calls, for comparison."""
    req = search_pb2.SearchRequest(
        collection="big", text=QUERY, top_k=5, include_text=True, include_metadata=True,
        mode=getattr(common_pb2, f"SEARCH_MODE_{mode.upper()}"),
    )
    times = []
    for i in range(rounds + 1):
        t0 = time.perf_counter()
        srv.stubs.search.Search(req, metadata=md)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        koder = Path(tmp) / "koder.toml"
        koder.write_text(KODER)
        srv = InProcessServer(
            Path(tmp) / "data", embedder=FakeEmbedder(), koder_toml=str(koder),
            shadow_embedders={"embeddings": FakeEmbedder(version="2")},
            http_port=free_port(), bootstrap_admin_key=KEY,
        )
        try:
            t0 = time.perf_counter()
            fill(srv, args.items, [("authorization", f"Bearer {KEY}")])
            print(f"filled {args.items:,} items in {time.perf_counter() - t0:.1f} s")
            port = srv.runtime.http.port
            query = urlencode({"collection": "big", "text": QUERY, "top_k": 5})
            pages = {
                "collections": "/console/collections",
                "collection (page 1)": "/console/collections/big",
                "collection (page 20)": "/console/collections/big?page=19",
                "playground (the page)": f"/console/playground?{query}",
                **{f"  its {mode} results (top 5)":
                   f"/console/playground/results?{query}&mode={mode}"
                   for mode in ("dense", "lexical", "hybrid")},
                "flip": "/console/flip",
                "store": "/console/store",
            }
            print(f"{'page':<30} {'p50 ms':>8} {'p90 ms':>8} {'HTML KiB':>9}")
            for name, path in pages.items():
                p50, p90, size = measure(port, path, args.rounds)
                print(f"{name:<30} {p50:8.1f} {p90:8.1f} {size / 1024:9.1f}")
            md = [("authorization", f"Bearer {KEY}")]
            for mode in ("dense", "lexical", "hybrid"):
                p50 = rpc_search(srv, mode, args.rounds, md)
                print(f"{'  Search RPC, ' + mode:<30} {p50:8.1f}")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
