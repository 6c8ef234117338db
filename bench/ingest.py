"""11. Bulk ingest: the same pipeline in this process and on Ray Data (one node), and the
server's upsert of precomputed vectors alone. The report holds only what this run measured;
the scaling model for N nodes built on these rates (and on the GPU rate of section 8) is written
by hand in BENCHMARKS.md, outside the section's markers.

`python -m bench.ingest` (prints; `--write` also updates BENCHMARKS.md) or
`python -m bench --only ingest`. A real server (onnx) in a subprocess, a few thousand real
passages (testkit). Runs alternate: in-process, Ray started by the run (`--ray local`), Ray
already running (what `--ray auto` on a running cluster pays), in-process again; the ratios
use the mean of the two in-process runs, so a drift of the shared machine lands on both
sides. An in-process ingest is bound by its embedding (the writes run on another thread and
are two orders of magnitude faster), so its rate is the per-node embedding rate.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.common import ROOT, run_concurrent, start_server, table  # noqa: E402
from ragplane.testkit.texts import corpus  # noqa: E402

N_ROWS = 2000
BATCH = 256


@dataclass
class Timed:
    rows: int
    seconds: float  # end to end, start-up included
    first_write: float  # seconds until the first batch was written
    where: str

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def _ingest(conn, collection: str, path: Path, ray: str) -> Timed:
    from ragplane.server.bulk.embed import EmbedderSpec
    from ragplane.server.bulk.pipeline import Options, ingest
    from ragplane.server.cli.ingest import GrpcWriter, _collection

    info = _collection(conn, collection, create=True)
    marks: list[float] = []
    t0 = time.perf_counter()
    summary = ingest(
        [str(path)],
        EmbedderSpec(info.embedder),
        GrpcWriter(conn, collection, info.embedder),
        Options(batch_rows=BATCH, ray=ray),
        lambda s: marks.append(time.perf_counter()),
    )
    end = time.perf_counter()
    return Timed(summary.read, end - t0, marks[0] - t0, summary.where)


def _embed_only(path: Path, identity: str) -> float:
    """Rows/s of the embedding stage alone in this process, no writes (model loaded first)."""
    from ragplane.server.bulk import rows
    from ragplane.server.bulk.embed import EmbedBatch, EmbedderSpec

    embed = EmbedBatch(EmbedderSpec(identity))
    chunks = list(rows.read_local([str(path)], BATCH))
    t0 = time.perf_counter()
    n = sum(len(embed(c)[rows.ID]) for c in chunks)
    return n / (time.perf_counter() - t0)


def _upsert_only(conn, source: str, ids: list[str]) -> dict[int, float]:
    """Rows/s of Upsert with precomputed vectors (those of `source`), 1 and 4 writers."""
    from ragplane.v1 import index_pb2, index_pb2_grpc

    stub = index_pb2_grpc.IndexServiceStub(conn.channel())
    items = []
    for lo in range(0, len(ids), 1000):
        items += stub.Get(
            index_pb2.GetRequest(collection=source, ids=ids[lo : lo + 1000], include_vectors=True)
        ).items
    out = {}
    for writers in (1, 4):
        name = f"upsert-only-{writers}"
        stub.CreateCollection(index_pb2.CreateCollectionRequest(name=name))
        batches = [items[lo : lo + BATCH] for lo in range(0, len(items), BATCH)]
        load = run_concurrent(
            lambda b, n=name: stub.Upsert(index_pb2.UpsertRequest(collection=n, items=b)),
            batches,
            writers,
        )
        out[writers] = len(items) / load.seconds
    return out


def measure(n: int = N_ROWS) -> dict:
    from ragplane.server.bulk import raydata
    from ragplane.server.cli.common import Conn

    texts = corpus(n)
    path = Path(tempfile.mkdtemp(prefix="ragplane-bench-ingest-")) / "corpus.jsonl"
    with open(path, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"d{i}", "text": t, "metadata": {"n": i}}) + "\n")
    srv = start_server("embedder=onnx", "koder_toml=", "device=cpu")
    conn = Conn(f"127.0.0.1:{srv.port}", "", "", 300.0)
    try:
        local1 = _ingest(conn, "in-process-1", path, "")
        cold = _ingest(conn, "ray-cold", path, "local")
        with raydata.session("local"):  # up before the run, as a cluster would be
            warm = _ingest(conn, "ray-warm", path, "local")
        local2 = _ingest(conn, "in-process-2", path, "")
        identity = _collection_embedder(conn)
        embed_rate = _embed_only(path, identity)
        upsert = _upsert_only(conn, "in-process-1", [f"d{i}" for i in range(n)])
    finally:
        conn.close()
        srv.stop()
    words = np.array([len(t.split()) for t in texts])
    return {
        "rows": n,
        "mean_words": float(words.mean()),
        "embedder": identity,
        "in_process": [_row(local1), _row(local2)],
        "ray_cold": _row(cold),
        "ray_warm": _row(warm),
        "embed_only_rows_per_s": embed_rate,
        "upsert_rows_per_s": upsert,
    }


def _row(t: Timed) -> dict:
    return {**vars(t), "rate": t.rate}


def _collection_embedder(conn) -> str:
    from ragplane.v1 import index_pb2, index_pb2_grpc

    stub = index_pb2_grpc.IndexServiceStub(conn.channel())
    return stub.DescribeCollection(index_pb2.DescribeCollectionRequest(name="ray-warm")).embedder


def report(r: dict) -> str:
    local, cold, warm = r["in_process"], r["ray_cold"], r["ray_warm"]
    base = float(np.mean([x["rate"] for x in local]))
    rows = [
        [
            label,
            x["rows"],
            f"{x['seconds']:.1f}",
            f"{x['rate']:,.1f}",
            f"{x['first_write']:.1f}",
            "" if x in local else f"{x['rate'] / base:.2f}x",
        ]
        for label, x in (
            ("in-process (1st)", local[0]),
            ("Ray, started by the run", cold),
            ("Ray, already running", warm),
            ("in-process (2nd)", local[1]),
        )
    ]
    u1, u4 = r["upsert_rows_per_s"]["1"], r["upsert_rows_per_s"]["4"]
    spread = abs(local[0]["rate"] - local[1]["rate"]) / base
    md = table(
        ["run", "rows", "wall s", "rows/s", "s to first write", "Ray / in-process (goal >= 0.8x)"],
        rows,
    )
    return md + (
        f"\n\n{r['rows']:,} real passages (testkit corpus, mean {r['mean_words']:.0f} words), "
        f"{r['embedder']}, batches of {BATCH}, end to end (start-up included). Ray ran on "
        f"{warm['where']}. The two in-process runs differ by {spread:.0%}.\n\n"
        f"First write: Ray started by the run (`--ray local`) "
        f"{cold['first_write'] - warm['first_write']:.0f} s later than Ray already running.\n\n"
        f"Alone, in this process: the embedding stage without writes "
        f"{r['embed_only_rows_per_s']:,.1f} rows/s (in-process ingest {base:,.1f}). The "
        f"server's Upsert of precomputed vectors: {u1:,.0f} rows/s from one writer (the "
        f"ingest's driver), {u4:,.0f} rows/s from four."
    )


def run() -> tuple[dict, str]:
    r = json.loads(json.dumps(measure()))  # str keys, as in the JSON results file
    return r, report(r)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=N_ROWS)
    p.add_argument("--write", action="store_true", help="update BENCHMARKS.md section 11")
    p.add_argument("--json-out", default="", help="also write the measurements here")
    args = p.parse_args()
    t0 = time.perf_counter()
    r = json.loads(json.dumps(measure(args.rows)))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=2) + "\n")
    md = report(r)
    print("\n" + md)
    if args.write:
        from bench.__main__ import write_section

        write_section(ROOT / "BENCHMARKS.md", "ingest", md, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
