"""AdminService and `ragplane admin`: a zero-downtime rebuild of 20,000 items under live
searches and upserts, rollback, compaction, snapshot/restore, and readable CLI output."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from ragplane.server.cli import app
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import admin_pb2, common_pb2, index_pb2, search_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

N = 20_000
DIM = 64


def vec(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM).astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()


def fill(stubs, name: str, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(0, n, 2000):
        stubs.index.Upsert(
            index_pb2.UpsertRequest(
                collection=name,
                items=[
                    common_pb2.Item(id=f"item-{j}", text=f"item number {j}", vector=vec(rng))
                    for j in range(i, min(i + 2000, n))
                ],
            )
        )


def _search_until(s, stop, failures: list[str], searches: list[int]) -> None:
    """Search until `stop`, counting successes and recording every failure."""
    rng = np.random.default_rng(1)
    while not stop.is_set():
        try:
            r = s.search.Search(
                search_pb2.SearchRequest(
                    collection="big", vector=common_pb2.Vector(values=vec(rng)), top_k=10
                ),
                timeout=30,
            )
            assert r.returned_k == 10
            searches[0] += 1
        except Exception as exc:  # any failed request fails the test
            failures.append(f"search: {exc!r}")

def _upsert_until(s, stop, failures: list[str], acked: dict[str, list[float]]) -> None:
    """Upsert batches of 20 until `stop`, recording what was acknowledged."""
    rng = np.random.default_rng(2)
    i = 0
    while not stop.is_set():
        batch = {f"live-{i + j}": vec(rng) for j in range(20)}
        try:
            s.index.Upsert(
                index_pb2.UpsertRequest(
                    collection="big",
                    items=[common_pb2.Item(id=k, vector=v) for k, v in batch.items()],
                ),
                timeout=30,
            )
            acked.update(batch)
        except Exception as exc:
            failures.append(f"upsert: {exc!r}")
        i += 20


def _assert_each_finds_itself(s, sample: list[str], acked: dict[str, list[float]]) -> None:
    for k in sample:
        r = s.search.Search(
            search_pb2.SearchRequest(
                collection="big", vector=common_pb2.Vector(values=acked[k]), top_k=1
            )
        )
        assert r.hits[0].id == k


def test_rebuild_under_load_loses_nothing_then_rolls_back(tmp_path):
    srv = InProcessServer(tmp_path / "d")
    try:
        s = srv.stubs
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="big"))
        fill(s, "big", N)
        stop = threading.Event()
        failures: list[str] = []
        acked: dict[str, list[float]] = {}
        searches = [0]

        threads = [
            threading.Thread(target=_search_until, args=(s, stop, failures, searches)),
            threading.Thread(target=_upsert_until, args=(s, stop, failures, acked)),
        ]
        for t in threads:
            t.start()
        time.sleep(0.5)
        phases = []
        for p in s.admin.Rebuild(
            admin_pb2.RebuildRequest(collection="big", index_type=index_pb2.INDEX_TYPE_HNSW)
        ):
            phases.append(p.phase)
            last = p
        time.sleep(0.5)  # traffic keeps flowing on the new generation
        stop.set()
        for t in threads:
            t.join()
        assert failures == []
        assert phases[-1] == "swapped" and "indexing" in phases and "checking" in phases
        assert last.recall >= 0.95 and last.generation == 2
        assert searches[0] > 0 and len(acked) > 0
        info = s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="big"))
        assert info.index_type == index_pb2.INDEX_TYPE_HNSW and info.generation == 2
        assert info.count == N + len(acked)
        got = s.index.Get(
            index_pb2.GetRequest(collection="big", ids=list(acked), include_vectors=True)
        )
        assert len(got.items) == len(acked)
        for it in got.items:  # cosine collections keep vectors L2-normalised (as sent here)
            np.testing.assert_allclose(np.float32(it.vector), np.float32(acked[it.id]), atol=1e-6)
        # upserts made during the rebuild are searchable in the new generation
        sample = list(acked)[:: max(1, len(acked) // 20)]
        _assert_each_finds_itself(s, sample, acked)
        back = s.admin.Rollback(admin_pb2.RollbackRequest(collection="big"))
        assert back.generation == 1 and back.index_type == index_pb2.INDEX_TYPE_FLAT
        assert back.count == N + len(acked)
        _assert_each_finds_itself(s, sample, acked)
    finally:
        srv.stop()


def test_refused_rebuild_keeps_serving(server):
    s = server.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c"))
    fill(s, "c", 3000)
    with pytest.raises(grpc.RpcError) as e:
        list(
            s.admin.Rebuild(
                admin_pb2.RebuildRequest(
                    collection="c",
                    index_type=index_pb2.INDEX_TYPE_HNSW,
                    min_recall=1.0,
                    params=index_pb2.IndexParams(
                        hnsw_m=2, hnsw_ef_search=1, hnsw_ef_construction=8
                    ),
                )
            )
        )
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "recall" in e.value.details()
    info = s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c"))
    assert info.generation == 1 and info.index_type == index_pb2.INDEX_TYPE_FLAT


def test_compact_snapshot_restore(server, tmp_path):
    s = server.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c"))
    fill(s, "c", 100)
    s.index.Delete(
        index_pb2.DeleteRequest(
            collection="c", ids=common_pb2.IdList(ids=[f"item-{i}" for i in range(10)])
        )
    )
    assert (
        s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c")).tombstones == 10
    )
    assert s.admin.Compact(admin_pb2.CompactRequest(collection="c")).removed == 10
    assert s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c")).tombstones == 0
    snap = tmp_path / "snap"
    r = s.admin.Snapshot(admin_pb2.SnapshotRequest(dir=str(snap)))
    assert r.bytes > 0
    from ragplane.server.admin import AdminOps

    AdminOps.restore(snap, tmp_path / "restored")
    # A snapshot is an embedded store in both modes (with a PostgreSQL store: the server's
    # indexes at the position it had applied), served as one.
    other = InProcessServer(tmp_path / "restored", store="sqlite")
    try:
        info = other.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c"))
        assert info.count == 90
    finally:
        other.stop()


def test_cli_reads_well(server):
    s = server.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
    fill(s, "docs", 500)
    runner = CliRunner()
    addr = ["--addr", f"127.0.0.1:{server.port}"]
    out = runner.invoke(app, ["admin", *addr, "status"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "docs" in out.output and "500" in out.output and "fake@1" in out.output
    out = runner.invoke(
        app, ["admin", *addr, "rebuild", "docs", "--index-type", "hnsw"], catch_exceptions=False
    )
    assert out.exit_code == 0, out.output
    assert "swapped docs to generation 2" in out.output and "recall@10" in out.output
    out = runner.invoke(app, ["admin", *addr, "rollback", "docs"])
    assert out.exit_code == 0 and "generation 1" in out.output
    out = runner.invoke(app, ["admin", *addr, "rebuild", "nope"])
    assert out.exit_code == 1 and "NOT_FOUND" in out.output and "nope" in out.output
    out = runner.invoke(app, ["admin", "--addr", "127.0.0.1:1", "status"])
    assert out.exit_code == 1 and "cannot reach ragplane at 127.0.0.1:1" in out.output


def test_cli_with_keys(server):
    info, admin_secret = server.runtime.keys.create("default", ["read", "write", "admin"])
    runner = CliRunner()
    addr = ["--addr", f"127.0.0.1:{server.port}"]
    out = runner.invoke(app, ["admin", *addr, "status"])
    assert out.exit_code == 1 and "UNAUTHENTICATED" in out.output and "--key" in out.output
    out = runner.invoke(
        app,
        [
            "admin",
            *addr,
            "--key",
            admin_secret,
            "keys",
            "create",
            "--tenant",
            "acme",
            "--scope",
            "read",
        ],
    )
    assert out.exit_code == 0 and "secret (shown once)" in out.output
    secret = out.output.split("secret (shown once):")[1].split()[0]
    out = runner.invoke(app, ["admin", *addr, "--key", secret, "status"])
    assert out.exit_code == 1 and "PERMISSION_DENIED" in out.output and "admin scope" in out.output
    out = runner.invoke(app, ["admin", *addr, "--key", admin_secret, "keys", "list"])
    assert out.exit_code == 0 and "acme" in out.output and secret not in out.output
