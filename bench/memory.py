"""Peak resident memory of a server holding 1,000,000 vectors of 384 dims in one collection."""

from __future__ import annotations

import numpy as np

from bench.common import start_server, table
from ragplane.v1 import common_pb2, index_pb2, index_pb2_grpc

DIM = 384


def run(n: int = 1_000_000, batch: int = 2000) -> tuple[dict, str]:
    srv = start_server("embedder=fake", "koder_toml=")
    try:
        stub = index_pb2_grpc.IndexServiceStub(srv.channel())
        stub.CreateCollection(index_pb2.CreateCollectionRequest(name="big", dim=DIM))
        rng = np.random.default_rng(0)
        for i in range(0, n, batch):
            x = rng.standard_normal((batch, DIM)).astype(np.float32)
            stub.Upsert(
                index_pb2.UpsertRequest(
                    collection="big",
                    items=[
                        common_pb2.Item(id=str(i + j), vector=row)
                        for j, row in enumerate(x.tolist())
                    ],
                )
            )
        info = stub.DescribeCollection(index_pb2.DescribeCollectionRequest(name="big"))
        peak = srv.peak_rss_mb()
        db = srv.disk_mb()
    finally:
        srv.stop()
    raw = n * DIM * 4 / 2**20
    res = {"items": info.count, "peak_rss_mb": peak, "raw_vectors_mb": raw, "data_dir_mb": db}
    md = table(
        ["items", "dim", "raw float32 MB", "server peak RSS MB", "RSS / raw", "data dir MB"],
        [
            [
                f"{info.count:,}",
                DIM,
                f"{raw:,.0f}",
                f"{peak:,.0f}",
                f"{peak / raw:.2f}",
                f"{db:,.0f}",
            ]
        ],
    )
    return res, md
