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
text) takes the N vectors as Upserts of `--batch` into a flat collection (ingest rate), item
i with the metadata {"b": i % 100}, then an admin Rebuild to each index type (build time,
the rebuild's own canary included). On each index: recall@10, q/s and p50/p99 one query at
a time from this process; q/s and p50/p99 at concurrency 32 from ghz (Go, one core, the
repository's protos; `scripts/install_tools.sh ghz`), or from Python threads in this
process when ghz is missing (they take the server's cores: a floor); the per-request knob's
curve (`params.ef_search` / `params.nprobe`); filters `b < 1` and `b < 10` (1% and 10% of
the items), against exact search over the matching items; server RSS from /proc, disk from
its data directory. In-process, after: the same index types built by FAISS on the same
vectors, recall and q/s over a sweep of efSearch / nprobe.

    python -m bench.ann_scale [--n 1000000] [--types flat,hnsw,ivf_pq] [--queries 500]
        [--in-process TYPES] [--json bench/out/ann_scale.json] [--report JSON]

The JSON is rewritten after every step (a run cut short keeps what it measured);
`--report` prints the tables of one.

At 1M on 2 cores the run takes ~1 h (embedding ~3 min, ingest and builds most of it) and
needs ~6 GB of memory; nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import faiss
import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from bench.common import ROOT, Load, run_concurrent, start_server, table
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
    "hnsw_int8": index_pb2.INDEX_TYPE_HNSW,  # served only: int8 codes, rescored
}
# the per-request knob each index type's curve sweeps, and its values
CURVES = {"hnsw": ("ef_search", [16, 32, 64, 256]), "ivf_pq": ("nprobe", [4, 16, 64])}
PARAMS = {"hnsw_int8": index_pb2.IndexParams(quantization=index_pb2.QUANTIZATION_INT8)}


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


def blocks(base: np.ndarray, n: int, seed: int = 0) -> Iterator[np.ndarray]:
    """The `n` vectors normalize(e_i + a e_j + 0.02 g), 100,000 at a time (the same for
    the same seed, however they are consumed)."""
    rng = np.random.default_rng(seed)
    for lo in range(0, n, 100_000):
        m = min(100_000, n - lo)
        i, j = rng.integers(0, len(base), m), rng.integers(0, len(base), m)
        a = rng.uniform(0, 0.5, (m, 1)).astype(np.float32)
        v = base[i] + a * base[j] + 0.02 * rng.standard_normal((m, base.shape[1]), np.float32)
        yield v / np.linalg.norm(v, axis=1, keepdims=True)


def extend(base: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """All of `blocks` in one array."""
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    for lo, block in zip(range(0, n, 100_000), blocks(base, n, seed), strict=True):
        out[lo : lo + len(block)] = block
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
        idx = faiss.index_factory(DIM, f"IVF{nlist},PQ64x8np", faiss.METRIC_INNER_PRODUCT)
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


BUCKETS = 100  # item i carries {"b": i % 100}: a filter b < cut keeps cut% of the items
SELECTIVITY = {"1%": 1, "10%": 10}
GHZ = ROOT / ".tools" / "bin" / "ghz"
PROTO = ROOT / "protos" / "ragplane" / "v1" / "search.proto"


def _flt(cut: int) -> dict:
    return {"must": [{"field": "b", "op": "FILTER_OP_LT", "value": cut}]}


def filtered_top10(x: np.ndarray, q: np.ndarray, cut: int) -> np.ndarray:
    """Exact top 10 among the items whose bucket is below `cut`, as item numbers."""
    ids = np.flatnonzero(np.arange(len(x)) % BUCKETS < cut)
    return ids[exact_top10(x[ids], q)]


def create(ch, kind: str = "flat", params: index_pb2.IndexParams | None = None) -> None:
    index_pb2_grpc.IndexServiceStub(ch).CreateCollection(index_pb2.CreateCollectionRequest(
        name="scale", dim=DIM, lexical_index=False, index_type=TYPES[kind], params=params,
    ))  # fmt: skip


def upsert(ch, x: np.ndarray, start: int, batch: int, total: int) -> None:
    """`x` as items `start`.. with their bucket, `batch` an Upsert."""
    index = index_pb2_grpc.IndexServiceStub(ch)
    for lo in range(0, len(x), batch):
        items = []
        for i, r in enumerate(x[lo : lo + batch], start + lo):
            md = Struct()
            md.update({"b": i % BUCKETS})
            items.append(common_pb2.Item(id=str(i), vector=r.tolist(), metadata=md))
        index.Upsert(index_pb2.UpsertRequest(collection="scale", items=items), timeout=600)
        if (start + lo) // batch % 50 == 0:
            log(f"ingested {start + lo + len(items):,} of {total:,}")


def _ingest(ch, x: np.ndarray, batch: int) -> float:
    create(ch)
    t0 = time.perf_counter()
    upsert(ch, x, 0, batch, len(x))
    return time.perf_counter() - t0


def requests(q: np.ndarray, params: dict | None, flt: dict | None) -> list[dict]:
    out = []
    for v in q:
        r: dict = {"collection": "scale", "vector": {"values": v.tolist()}, "top_k": 10}
        if params:
            r["params"] = params
        if flt:
            r["filter"] = flt
        out.append(r)
    return out


def messages(reqs: list[dict]) -> list[search_pb2.SearchRequest]:
    return [json_format.ParseDict(r, search_pb2.SearchRequest()) for r in reqs]


def _stats(load: Load) -> dict:
    return {"qps": load.per_second, "p50_ms": load.p(0.5) * 1e3, "p99_ms": load.p(0.99) * 1e3}


def _recall_run(ch, reqs: list[dict], truth: np.ndarray) -> dict:
    """One query at a time from this process: recall@10, q/s and latency at concurrency 1."""
    search = search_pb2_grpc.SearchServiceStub(ch)
    msgs = messages(reqs)
    found: list[list[int]] = []

    def call(m: object) -> None:
        r = search.Search(m, timeout=120)
        found.append([int(h.id) for h in r.hits])

    search.Search(msgs[0], timeout=1800)  # a filter's first use reads its matches: not timed
    load = run_concurrent(call, msgs, 1)
    ids = np.asarray([f + [-1] * (10 - len(f)) for f in found])
    return {**_stats(load), "recall": recall(ids, truth)}


def load_run(ch, port: int, reqs: list[dict], concurrency: int, total: int) -> dict:
    """`total` searches at `concurrency`: by ghz (Go, one core, the protos) when
    `scripts/install_tools.sh ghz` installed it, else by Python threads in this process."""
    if GHZ.exists():
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(reqs, f)
        try:
            res = subprocess.run(
                [str(GHZ), "--insecure", "--proto", str(PROTO), "-i", str(ROOT / "protos"),
                 "--call", "ragplane.v1.SearchService/Search", "-D", f.name,
                 "-c", str(concurrency), "-n", str(total), "--cpus", "1", "-O", "json",
                 f"127.0.0.1:{port}"],
                capture_output=True, text=True, timeout=3600,
            )  # fmt: skip
            if res.returncode:
                raise RuntimeError(f"ghz failed ({res.returncode}): {res.stderr.strip()}")
        finally:
            os.unlink(f.name)
        r = json.loads(res.stdout)
        lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
        codes = r.get("statusCodeDistribution") or {}
        return {"qps": r["rps"], "p50_ms": lat.get(50, float("nan")),
                "p99_ms": lat.get(99, float("nan")), "client": "ghz",
                "errors": sum(v for k, v in codes.items() if k != "OK")}  # fmt: skip
    search = search_pb2_grpc.SearchServiceStub(ch)
    msgs = messages(reqs)
    load = run_concurrent(lambda i: search.Search(msgs[i % len(msgs)], timeout=120),
                          list(range(total)), concurrency)  # fmt: skip
    return {**_stats(load), "client": "python threads", "errors": 0}


def index_runs(ch, port: int, kind: str, q: np.ndarray, truth: dict, n_load: int,
                save: Callable[[], None], row: dict) -> None:  # fmt: skip
    """Recall and speed on the built index: unfiltered, the knob's curve, filtered."""
    plain = requests(q, None, None)
    row["c1"] = _recall_run(ch, plain, truth["all"])
    row["c32"] = load_run(ch, port, plain, 32, n_load)
    save()
    knob, values = CURVES.get(kind, ("", []))
    for k in values:
        reqs = requests(q, {knob: k}, None)
        row.setdefault("curve", []).append({
            "knob": k, "c1": _recall_run(ch, reqs, truth["all"]),
            "c32": load_run(ch, port, reqs, 32, n_load),
        })  # fmt: skip
        save()
    for name, cut in SELECTIVITY.items():
        reqs = requests(q, None, _flt(cut))
        row.setdefault("filtered", {})[name] = {
            "c1": _recall_run(ch, reqs, truth[name]),
            "c32": load_run(ch, port, reqs, 32, n_load),
        }  # fmt: skip
        save()


def rebuild_to(admin, kind: str) -> float | str:
    """Rebuild the collection to `kind`: the canary's recall, or why the swap was refused."""
    last, canary = None, 0.0
    req = admin_pb2.RebuildRequest(collection="scale", index_type=TYPES[kind],
                                   params=PARAMS.get(kind))  # fmt: skip
    try:
        for p in admin.Rebuild(req, timeout=7200):
            if last is None or p.phase != last.phase:
                log(f"rebuild {kind}: {p.phase} {p.done:,}/{p.total:,} {p.message}")
            last, canary = p, p.recall or canary
    except grpc.RpcError as e:  # a canary below min_recall: FAILED_PRECONDITION
        log(f"rebuild {kind}: {e.code().name}: {e.details()}")
        return f"{e.code().name}: {e.details()}"
    if last is not None and last.phase != "swapped":
        return f"{last.phase}: {last.message}"
    return canary


def served(x: np.ndarray, q: np.ndarray, truth: dict, types: list[str], batch: int,
           out: dict, save: Callable[[], None]) -> None:  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="ragplane-ann-"))
    server = start_server("embedder=fake", data_dir=scratch / "data", timeout=600)
    n_load = max(2000, 4 * len(q))
    try:
        ch = server.sub.stubs.channel
        out["ingest_s"] = _ingest(ch, x, batch)
        save()
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        serving = "flat"  # what the collection was created as
        for kind in types:
            log(f"served: {kind}")
            t0 = time.perf_counter()
            canary = 0.0
            if kind != serving:  # flat after another type is a rebuild back to flat
                refused = rebuild_to(admin, kind)
                if isinstance(refused, str):
                    out[kind] = {"refused": refused}
                    save()
                    continue
                canary, serving = refused, kind
            row: dict = {"build_s": time.perf_counter() - t0,
                         "canary": canary or None,
                         "rss_mib": server.rss_mb(), "disk_mib": server.disk_mb()}  # fmt: skip
            out[kind] = row
            index_runs(ch, server.sub.port, kind, q, truth, n_load, save, row)
            row["rss_after_mib"] = server.rss_mb()
            save()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def measure(n: int, types: list[str], in_proc: list[str], n_queries: int, batch: int,
            path: Path) -> dict:  # fmt: skip
    """Served first, then in-process; the JSON at `path` is rewritten after every step,
    so a run cut short keeps what it measured."""
    passages = embedded_passages()
    q, base = passages[:n_queries], passages[n_queries:]
    t0 = time.perf_counter()
    x = extend(base, n)
    truth = {"all": exact_top10(x, q)}
    truth.update({name: filtered_top10(x, q, cut) for name, cut in SELECTIVITY.items()})
    res: dict = {"n": n, "queries": n_queries, "make_s": time.perf_counter() - t0,
                 "served": {}, "in_process": {}}  # fmt: skip

    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2))

    log(f"{n:,} vectors and their ground truth in {res['make_s']:.0f} s")
    served(x, q, truth, types, batch, res["served"], save)
    for kind in in_proc:
        log(f"in-process: {kind}")
        res["in_process"][kind] = in_process(x, q, truth["all"], kind)
        save()
    return res


def _ms(c: dict) -> str:
    return f"{c['qps']:,.0f} / {c['p50_ms']:.1f} / {c['p99_ms']:.1f} ms"


def report(r: dict) -> str:
    s = r["served"]
    clients = {c["client"] for x in s.values() if isinstance(x, dict) and "c32" in x
               for c in [x["c32"]]}  # fmt: skip
    lines = [f"{r['n']:,} vectors x {DIM}, {r['queries']} held-out queries, recall@10 "
             "against exact search.", "",
             f"Served (ingest {r['n'] / s['ingest_s']:,.0f} vectors/s; c=1 from Python, one "
             f"query at a time; c=32 by {', '.join(sorted(clients)) or '-'}):", ""]  # fmt: skip
    rows = []
    for kind, x in s.items():
        if not isinstance(x, dict):
            continue
        if "refused" in x:
            rows.append([kind, x["refused"], "", "", "", "", "", ""])
            continue
        if "c32" not in x:
            continue
        canary = f"{x['canary']:.3f}" if x.get("canary") else "-"
        rows.append([kind, f"{x['build_s']:.0f}", canary, f"{x['c1']['recall']:.3f}", _ms(x["c1"]),
                     _ms(x["c32"]), f"{x.get('rss_after_mib', x['rss_mib']):,.0f}",
                     f"{x['disk_mib']:,.0f}"])  # fmt: skip
    lines.append(table(["index", "build s", "canary", "recall@10", "c=1 q/s / p50 / p99",
                        "c=32 q/s / p50 / p99", "RSS MiB", "disk MiB"], rows))  # fmt: skip
    rows = [
        [kind, str(c["knob"]), f"{c['c1']['recall']:.3f}", _ms(c["c1"]), _ms(c["c32"])]
        for kind, x in s.items()
        if isinstance(x, dict)
        for c in x.get("curve", [])
    ]
    if rows:
        lines += ["", "Served, the per-request knob (`params.ef_search` / `params.nprobe`):", "",
                  table(["index", "knob", "recall@10", "c=1 q/s / p50 / p99",
                         "c=32 q/s / p50 / p99"], rows)]  # fmt: skip
    rows = [[kind, name, f"{c['c1']['recall']:.3f}", _ms(c["c1"]), _ms(c["c32"]),
             f"{c['c1']['p50_ms'] / x['c1']['p50_ms']:.2f}x"]
            for kind, x in s.items() if isinstance(x, dict)
            for name, c in x.get("filtered", {}).items()]  # fmt: skip
    if rows:
        lines += ["", "Served, filtered (`b < cut` on a metadata field; recall against exact "
                  "search over the matching items):", "",
                  table(["index", "selectivity", "recall@10", "c=1 q/s / p50 / p99",
                         "c=32 q/s / p50 / p99", "c=1 p50 / unfiltered"], rows)]  # fmt: skip
    rows = [
        [kind, str(x["knob"]), f"{x['recall']:.3f}", f"{x['qps']:,.0f}", f"{x['build_s']:.0f}"]
        for kind, xs in r["in_process"].items()
        for x in xs
    ]
    if rows:
        lines += [
            "",
            "In-process FAISS (one thread, one query at a time):",
            "",
            table(["index", "efSearch / nprobe", "recall@10", "q/s", "build s"], rows),
        ]
    return "\n".join(lines)


def parse_args(prog: str, doc: str | None, n: int, add: Callable[[argparse.ArgumentParser], None]
               ) -> argparse.Namespace:  # fmt: skip
    """The ANN benches' command line: `add` adds a bench's own options to the shared ones."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--n", type=int, default=n)
    add(p)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--batch", type=int, default=2000, help="vectors per Upsert")
    p.add_argument("--json", default=str(OUT / f"{prog.split('.')[-1]}.json"))
    p.add_argument("--report", metavar="JSON", help="print the tables of an earlier run")
    return p.parse_args()


def _own_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--types", default="flat,hnsw,ivf_pq", help="served index types, in order")
    p.add_argument("--in-process", default=None,
                   help="index types FAISS builds in-process after the served run "
                        "(default: --types; '' for none)")  # fmt: skip


def main() -> int:
    a = parse_args("bench.ann_scale", __doc__, 1_000_000, _own_args)
    if a.report:
        print(report(json.loads(Path(a.report).read_text())))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    types = [t for t in a.types.split(",") if t]
    in_proc = types if a.in_process is None else [t for t in a.in_process.split(",") if t]
    unknown = (set(types) - set(TYPES)) | (set(in_proc) - (set(TYPES) - set(PARAMS)))
    if unknown:
        in_process_types = ", ".join(t for t in TYPES if t not in PARAMS)
        raise SystemExit(f"unknown index types {sorted(unknown)}; served: {', '.join(TYPES)}; "
                         f"in-process: {in_process_types}")  # fmt: skip
    if not GHZ.exists():
        log(
            "no .tools/bin/ghz (scripts/install_tools.sh ghz): concurrent load from Python "
            "threads, which take the server's cores"
        )
    r = measure(a.n, types, in_proc, a.queries, a.batch, Path(a.json))
    print(report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
