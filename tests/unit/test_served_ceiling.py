"""bench.served_ceiling's bounds: the bare scan server answers what an exact search of the
ceiling's vectors answers (else its q/s bounds nothing), and the report states the bound
and this path's share of it."""

from __future__ import annotations

import numpy as np

from bench.bare_search import start_bare
from bench.served_ceiling import _vectors, report
from ragplane.v1 import search_pb2, search_pb2_grpc


def test_bare_scan_answers_the_exact_top_10():
    n = 300
    x, q = _vectors(n)
    bare = start_bare("scan", n)
    try:
        stub = search_pb2_grpc.SearchServiceStub(bare.channel())
        for row in q[:5]:
            req = search_pb2.SearchRequest(collection="scale", top_k=10)
            req.vector.values.extend(row.tolist())
            reply = stub.Search(req, timeout=30)
            want = np.argsort(-(x @ row))[:10]
            assert [h.id for h in reply.hits] == [str(i) for i in want]
            np.testing.assert_allclose([h.score for h in reply.hits], (x @ row)[want],
                                       rtol=1e-5)  # fmt: skip
        assert bare.cpu_seconds() > 0 and bare.switches() > 0
    finally:
        bare.stop()
    assert bare.proc.returncode == 0  # stopped by closing its stdin, not killed


def _row(qps: float) -> dict:
    return {"qps": qps, "p50_ms": 20.0, "p99_ms": 40.0, "errors": 0, "client": "ghz",
            "cpu_us": 900.0, "switches": 24.0, "c1_p50_ms": 1.1}  # fmt: skip


def test_report_states_the_bound_and_this_paths_share():
    run = {"baseline": "105f6d2", "this": "abc1234", "cpu": "some CPU", "n": 2000,
           "rounds": [{"baseline": _row(1000), "this": _row(1300), "bare scan": _row(2000),
                       "bare fixed": _row(4000)}]}  # fmt: skip
    text = report(run)
    assert "**1.30x**" in text
    assert "bare gRPC: the scan alone | 2,000 |" in text
    assert "2.00x the baseline" in text and "serves 65% of it" in text
    # a run without bounds (or from before switches were counted) still reads
    del run["rounds"][0]["bare scan"], run["rounds"][0]["bare fixed"]
    del run["rounds"][0]["this"]["switches"]
    text = report(run)
    assert "bare" not in text and "| - |" in text
