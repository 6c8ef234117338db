"""`python -m bench.ann_stream`: one collection larger than this machine holds twice
(issue 41: 10M vectors on 2 cores, 24 GiB) -- ingest, training, recall@10 and served q/s.

`bench.ann_scale` holds all N float vectors in its process and ingests them into a flat
collection, which holds them again, before a rebuild reads them a third time: at 10M x 384
that is 15 GB each. Here nothing holds them all. The vectors are `bench.ann_scale`'s (the
same real-text embeddings extended by mixtures and perturbations, the same seed), made
100,000 at a time, twice: once for the exact ground truth (a running top 10 per query,
unfiltered and for the 1% / 10% filters), once to ingest. The collection is created as
`--type` with the parameters a rebuild at N would choose (IVF_PQ: nlist = sqrt(N)); after
`--train-at` items an admin Rebuild trains it (its canary measured then), and the rest of
the items are added to the trained index as they arrive, as a user's growing collection
would be. Then the measurements of `bench.ann_scale` on the served index: recall@10 at c=1,
q/s at c=32 (ghz), the per-request knob's curve, the filters, RSS and disk.

    python -m bench.ann_stream [--n 10000000] [--type ivf_pq] [--train-at 200000]
        [--queries 500] [--json bench/out/ann_stream.json] [--report JSON]

At 10M on 2 cores: ~25 min of ingest, ~17 GB of disk, a few GB of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.ann_scale import (
    BUCKETS,
    DIM,
    PARAMS,
    SELECTIVITY,
    TYPES,
    blocks,
    create,
    embedded_passages,
    index_runs,
    log,
    parse_args,
    rebuild_to,
    report,
    upsert,
)
from bench.common import start_server
from ragplane.index import IndexParams, IndexType
from ragplane.index.faiss_index import resolve_params
from ragplane.v1 import admin_pb2_grpc, index_pb2


def streamed_truth(base: np.ndarray, n: int, q: np.ndarray) -> dict[str, np.ndarray]:
    """Exact top 10 of each query over the `n` vectors of `blocks`, block by block: for
    every item ("all") and for each filter of `SELECTIVITY`, as item numbers."""
    cuts = {"all": BUCKETS, **SELECTIVITY}
    best = {k: (np.full((len(q), 10), -np.inf, np.float32), np.full((len(q), 10), -1))
            for k in cuts}  # fmt: skip
    lo = 0
    for block in blocks(base, n):
        scores = q @ block.T
        ids = np.arange(lo, lo + len(block))
        for name, cut in cuts.items():
            cols = np.flatnonzero(ids % BUCKETS < cut)
            s = np.concatenate([best[name][0], scores[:, cols]], axis=1)
            i = np.concatenate([best[name][1], np.broadcast_to(ids[cols], (len(q), cols.size))],
                               axis=1)  # fmt: skip
            top = np.argpartition(-s, 9, axis=1)[:, :10]
            best[name] = (np.take_along_axis(s, top, 1), np.take_along_axis(i, top, 1))
        lo += len(block)
    return {name: b[1] for name, b in best.items()}


def params_at(kind: str, n: int) -> index_pb2.IndexParams:
    """What a rebuild of `n` items would choose, fixed at creation (IVF_PQ's nlist grows
    with N; training at `--train-at` items would otherwise size it for those)."""
    if kind == "ivf_pq":
        return index_pb2.IndexParams(
            ivf_nlist=resolve_params(IndexType.IVF_PQ, DIM, IndexParams(), n).ivf_nlist
        )
    return PARAMS.get(kind) or index_pb2.IndexParams()


def measure(n: int, kind: str, train_at: int, n_queries: int, batch: int, path: Path) -> dict:
    passages = embedded_passages()
    q, base = passages[:n_queries], passages[n_queries:]
    t0 = time.perf_counter()
    truth = streamed_truth(base, n, q)
    res: dict = {"n": n, "queries": n_queries, "type": kind, "train_at": train_at,
                 "truth_s": time.perf_counter() - t0, "served": {}}  # fmt: skip

    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2))

    log(f"ground truth over {n:,} vectors in {res['truth_s']:.0f} s")
    scratch = Path(tempfile.mkdtemp(prefix="ragplane-ann-stream-"))
    server = start_server("embedder=fake", data_dir=scratch / "data", timeout=600)
    try:
        ch = server.sub.stubs.channel
        params = params_at(kind, n)
        create(ch, kind, params)
        row: dict = {"params": str(params).replace("\n", " ")}
        res["served"][kind] = row
        t0, lo = time.perf_counter(), 0
        for block in blocks(base, n):
            upsert(ch, block, lo, batch, n)
            lo += len(block)
            if lo >= train_at and "canary" not in row:
                t1 = time.perf_counter()
                row["canary"] = rebuild_to(admin_pb2_grpc.AdminServiceStub(ch), kind)
                row["build_s"] = time.perf_counter() - t1
                log(f"trained at {lo:,} items in {row['build_s']:.0f} s: {row['canary']}")
                save()
                if isinstance(row["canary"], str):  # refused: the rest would be held as floats
                    raise SystemExit(f"the training rebuild was refused: {row['canary']}")
        res["served"]["ingest_s"] = time.perf_counter() - t0
        row.update(rss_mib=server.rss_mb(), disk_mib=server.disk_mb())
        save()
        index_runs(ch, server.sub.port, kind, q, truth, max(2000, 4 * n_queries), save, row)
        row["rss_after_mib"] = server.rss_mb()
        save()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return res


def _own_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--type", default="ivf_pq", choices=sorted(TYPES))
    p.add_argument("--train-at", type=int, default=200_000,
                   help="items ingested before the rebuild that trains the index")  # fmt: skip


def main() -> int:
    a = parse_args("bench.ann_stream", __doc__, 10_000_000, _own_args)
    if a.report:
        r = json.loads(Path(a.report).read_text())
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        r = measure(a.n, a.type, min(a.train_at, a.n), a.queries, a.batch, Path(a.json))
    row = r["served"][r["type"]]
    print(
        f"{r['type']} ({row['params']}), trained at {r['train_at']:,} items in "
        f"{row['build_s']:.0f} s, canary {row['canary']}"
    )  # noqa: T201
    print(report({**r, "in_process": {}}))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
