"""`python -m bench.ann_scale`: ANN at scale (issue 41) -- recall@10 against served q/s,
ingest, build, memory and disk for each index type, on vectors that look like real
embeddings, beside FAISS in-process on the same vectors.

Vectors. The canonical embedder (ONNX Runtime, all-MiniLM-L6-v2) embeds the real passages
of `ragplane.testkit.texts.corpus` (pydoc topics, stdlib docstrings: ~10,900), the first
`--queries` held out as queries. The rest are extended to N by mixtures and perturbations,
each vector normalize(e_i + a * e_j + s * g) with i, j drawn from the embedded passages, a
uniform in [0, 0.5) and g Gaussian noise at s = 0.02 per dimension (about 0.4 of a unit
vector's norm: a neighbour of e_i, not a copy). Queries are embeddings of text no vector
was made from; ground truth is exact search (FAISS IndexFlatIP) over the N vectors.

Served. One `ragplane serve` (embedded store, the fake embedder: vectors are sent, not
text) takes the N vectors as Upserts of `--batch` into a flat collection (ingest rate),
then an admin Rebuild to each index type (build time, the rebuild's own canary included);
searches by vector, top 10, at concurrency 1 and 32 from Python threads in this process
(they share the server's 2 cores: the served q/s is a floor), with recall@10 against the
ground truth; server RSS from /proc and disk from its data directory. In-process: the same
index types built by FAISS on the same vectors, recall and q/s over a sweep of efSearch /
nprobe (the curve the per-request knobs choose from).

    python -m bench.ann_scale [--n 1000000] [--types flat,hnsw,ivf_pq] [--queries 500]
        [--json bench/out/ann_scale.json]

At 1M on 2 cores the run takes ~1 h (embedding ~3 min, ingest and builds most of it) and
needs ~6 GB of memory; nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from bench.common import ROOT, run_concurrent, start_server, table
from ragplane.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    index_pb2,
    index_pb2_grpc,
    search_pb2,
    search_pb2_grpc,
)

DIM = 384
OUT = ROOT / "bench" / "out"
TYPES = {
    "flat": index_pb2.INDEX_TYPE_FLAT,
    "hnsw": index_pb2.INDEX_TYPE_HNSW,
    "ivf_pq": index_pb2.INDEX_TYPE_IVF_PQ,
}


def embedded_passages() -> np.ndarray:
    """The canonical's embeddings of every real passage, cached under bench/out."""
    from ragplane.testkit.texts import corpus

    cache = OUT / "ann_scale_passages.npy"
    if cache.exists():
        return np.load(cache)
    from ragplane.server.embedding.onnx import OnnxEmbedder

    texts = corpus(10_000)
    e = OnnxEmbedder(device="cpu")
    vecs = np.concatenate([e.embed(texts[i : i + 64]) for i in range(0, len(texts), 64)])
    OUT.mkdir(parents=True, exist_ok=True)
    np.save(cache, vecs)
    return vecs


def extend(base: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """`n` vectors normalize(e_i + a e_j + 0.02 g), made 100,000 at a time."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    for lo in range(0, n, 100_000):
        m = min(100_000, n - lo)
        i, j = rng.integers(0, len(base), m), rng.integers(0, len(base), m)
        a = rng.uniform(0, 0.5, (m, 1)).astype(np.float32)
        v = base[i] + a * base[j] + 0.02 * rng.standard_normal((m, base.shape[1]), np.float32)
        out[lo : lo + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def exact_top10(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    idx = faiss.IndexFlatIP(x.shape[1])
    idx.add(x)
    return idx.search(q, 10)[1]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)]))


def in_process(x: np.ndarray, q: np.ndarray, truth: np.ndarray, kind: str) -> list[dict]:
    """FAISS alone on the same vectors: build time, then recall and q/s (one query at a
    time, one thread) for each efSearch / nprobe of the sweep."""
    n = len(x)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    if kind == "hnsw":
        idx = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = 128
        idx.add(x)
        knobs = [16, 32, 64, 128, 256]
    elif kind == "ivf_pq":
        nlist = max(16, int(4 * np.sqrt(n)))
        idx = faiss.index_factory(DIM, f"IVF{nlist},PQ64x8", faiss.METRIC_INNER_PRODUCT)
        idx.train(x[np.random.default_rng(1).choice(n, min(n, 50 * nlist), replace=False)])
        idx.add(x)
        knobs = [4, 8, 16, 32, 64, 128]
    else:
        idx = faiss.IndexFlatIP(DIM)
        idx.add(x)
        knobs = [0]
    build = time.perf_counter() - t0
    faiss.omp_set_num_threads(1)
    rows = []
    for k in knobs:
        if kind == "hnsw":
            idx.hnsw.efSearch = k
        elif kind == "ivf_pq":
            idx.nprobe = k
        t0 = time.perf_counter()
        found = np.vstack([idx.search(q[i : i + 1], 10)[1] for i in range(len(q))])
        took = time.perf_counter() - t0
        rows.append({"knob": k, "recall": recall(found, truth), "qps": len(q) / took,
                     "build_s": build})  # fmt: skip
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    return rows


def _ingest(ch, x: np.ndarray, batch: int) -> float:
    index = index_pb2_grpc.IndexServiceStub(ch)
    index.CreateCollection(
        index_pb2.CreateCollectionRequest(name="scale", dim=DIM, lexical_index=False)
    )
    t0 = time.perf_counter()
    for lo in range(0, len(x), batch):
        rows = x[lo : lo + batch]
        items = [common_pb2.Item(id=str(lo + i), vector=r.tolist()) for i, r in enumerate(rows)]
        index.Upsert(index_pb2.UpsertRequest(collection="scale", items=items), timeout=600)
    return time.perf_counter() - t0


def _searches(ch, q: np.ndarray, concurrency: int, repeat: int) -> tuple[dict, np.ndarray]:
    search = search_pb2_grpc.SearchServiceStub(ch)
    reqs = [
        search_pb2.SearchRequest(
            collection="scale", vector=common_pb2.Vector(values=v.tolist()), top_k=10
        )  # fmt: skip
        for v in q
    ]
    found: dict[int, list[int]] = {}

    def call(i: int) -> None:
        r = search.Search(reqs[i % len(reqs)], timeout=60)
        found[i % len(reqs)] = [int(h.id) for h in r.hits]

    load = run_concurrent(call, list(range(len(reqs) * repeat)), concurrency)
    ids = np.asarray([found[i] + [-1] * (10 - len(found[i])) for i in range(len(reqs))])
    return {"qps": load.per_second, "p50_ms": load.p(0.5) * 1e3, "p99_ms": load.p(0.99) * 1e3}, ids


def served(x: np.ndarray, q: np.ndarray, truth: np.ndarray, types: list[str], batch: int) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="ragplane-ann-"))
    server = start_server("embedder=fake", data_dir=scratch / "data", timeout=600)
    out: dict = {}
    try:
        ch = server.sub.stubs.channel
        out["ingest_s"] = _ingest(ch, x, batch)
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        for kind in types:
            t0 = time.perf_counter()
            if kind != "flat":
                last = None
                for p in admin.Rebuild(
                    admin_pb2.RebuildRequest(collection="scale", index_type=TYPES[kind]),
                    timeout=7200,
                ):
                    last = p
                if last is not None and last.phase != "swapped":
                    out[kind] = {"refused": f"{last.phase}: {last.message}"}
                    continue
            build = time.perf_counter() - t0
            row: dict = {"build_s": build}
            for conc in (1, 32):
                stats, ids = _searches(ch, q, conc, repeat=1 if conc == 1 else 4)
                row[f"c{conc}"] = {**stats, "recall": recall(ids, truth)}
            row["rss_mib"] = server.rss_mb()
            row["disk_mib"] = server.disk_mb()
            out[kind] = row
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def measure(n: int, types: list[str], n_queries: int, batch: int) -> dict:
    passages = embedded_passages()
    q, base = passages[:n_queries], passages[n_queries:]
    t0 = time.perf_counter()
    x = extend(base, n)
    truth = exact_top10(x, q)
    res: dict = {"n": n, "queries": n_queries, "make_s": time.perf_counter() - t0}
    res["in_process"] = {k: in_process(x, q, truth, k) for k in types}
    res["served"] = served(x, q, truth, types, batch)
    return res


def report(r: dict) -> str:
    lines = [f"{r['n']:,} vectors x {DIM}, {r['queries']} held-out queries, recall@10 "
             "against exact search.", "", "In-process FAISS (one thread, one query at a time):",
             ""]  # fmt: skip
    rows = [
        [kind, str(x["knob"]), f"{x['recall']:.3f}", f"{x['qps']:,.0f}", f"{x['build_s']:.0f}"]
        for kind, xs in r["in_process"].items()
        for x in xs
    ]
    lines.append(table(["index", "efSearch / nprobe", "recall@10", "q/s", "build s"], rows))
    s = r["served"]
    lines += ["", f"Served (ingest {r['n'] / s['ingest_s']:,.0f} vectors/s):", ""]
    rows = []
    for kind in r["in_process"]:
        x = s.get(kind, {})
        if "refused" in x:
            rows.append([kind, x["refused"], "", "", "", "", ""])
            continue
        rows.append([
            kind, f"{x['build_s']:.0f}",
            f"{x['c1']['recall']:.3f}", f"{x['c1']['qps']:,.0f} / {x['c1']['p50_ms']:.1f} ms",
            f"{x['c32']['qps']:,.0f} / {x['c32']['p50_ms']:.1f} / {x['c32']['p99_ms']:.1f} ms",
            f"{x['rss_mib']:,.0f}", f"{x['disk_mib']:,.0f}",
        ])  # fmt: skip
    lines.append(table(["index", "build s", "recall@10", "c=1 q/s / p50", "c=32 q/s / p50 / p99",
                        "RSS MiB", "disk MiB"], rows))  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ann_scale", description=__doc__)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--types", default="flat,hnsw,ivf_pq")
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--batch", type=int, default=2000, help="vectors per Upsert")
    p.add_argument("--json", default=str(OUT / "ann_scale.json"))
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    types = [t for t in a.types.split(",") if t]
    unknown = set(types) - set(TYPES)
    if unknown:
        p.error(f"unknown index types {sorted(unknown)}; known: {', '.join(TYPES)}")
    r = measure(a.n, types, a.queries, a.batch)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(r, indent=2))
    print(report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
