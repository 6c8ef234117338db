"""A full or read-only data directory: writes are refused with a status a person can act on,
reads keep working, nothing acknowledged is lost, and writes work again once space returns.
The same for a snapshot's destination: refused clearly, the partial copy removed.

The volume is a size-limited tmpfs the test mounts itself (root only; skipped otherwise).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from ragplane.core.errors import Corrupt, StorageFull, StorageReadOnly
from ragplane.core.storage import storage_error
from ragplane.server.auth import KeyStore
from ragplane.server.shadow.evidence import EvidenceKey, EvidenceStore
from ragplane.server.shadow.experiment import Experiment, Observation
from ragplane.testkit.harness import InProcessServer, SubprocessServer
from ragplane.v1 import admin_pb2, common_pb2, index_pb2, search_pb2

DIM = 256  # FAISS checkpoints as large as the rows: they run out of room first
# Freed to give the volume room again: at least what the WAL grew to, since closing the store
# copies the WAL into the database before the WAL file goes.
BALLAST = 4 << 20


def _mount(path: Path, size: str, *opts: str) -> None:
    path.mkdir(exist_ok=True)
    options = ",".join((f"size={size}", *opts))
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")


@pytest.fixture
def volume(tmp_path):
    """A 6 MiB filesystem holding a 4 MiB ballast file."""
    vol = tmp_path / "vol"
    _mount(vol, "6m")
    (vol / "ballast").write_bytes(os.urandom(BALLAST))
    yield vol
    subprocess.run(["umount", "-l", str(vol)], check=False)


def _upsert(stubs, start: int, n: int) -> list[str]:
    rng = np.random.default_rng(start)
    ids = [f"i{start + k}" for k in range(n)]
    items = [
        common_pb2.Item(id=i, vector=rng.standard_normal(DIM).tolist(), text="x" * 200) for i in ids
    ]
    stubs.index.Upsert(index_pb2.UpsertRequest(collection="c", items=items), timeout=30)
    return ids


def _fill(stubs, acked: list[str]) -> grpc.RpcError:
    """Upsert until the volume refuses; the refusal."""
    for _ in range(2000):
        try:
            acked += _upsert(stubs, len(acked), 20)
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("the volume never filled")


@pytest.mark.e2e
def test_full_disk_refuses_writes_clearly_and_recovers_without_restart(volume):
    srv = SubprocessServer(volume, "--set", "checkpoint_every=100")  # checkpoints hit it too
    srv.start()
    try:
        srv.stubs.index.CreateCollection(
            index_pb2.CreateCollectionRequest(name="c", dim=DIM, metric=index_pb2.METRIC_IP)
        )
        acked: list[str] = []
        err = _fill(srv.stubs, acked)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        assert str(volume) in err.details() and "free of 6.0 MiB" in err.details()
        trailers = dict(err.trailing_metadata())
        assert float(trailers["retry-after"]) > 0 and "grpc-retry-pushback-ms" in trailers
        again = _fill(srv.stubs, acked)  # the writer connection is not left wedged
        assert again.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, again.details()
        assert len(acked) >= 100

        q = search_pb2.SearchRequest(
            collection="c", vector=common_pb2.Vector(values=[1.0] * DIM), top_k=10_000
        )
        assert {h.id for h in srv.stubs.search.Search(q).hits} == set(acked)

        (volume / "ballast").unlink()
        acked += _upsert(srv.stubs, len(acked), 20)  # space is back: no restart needed
        assert {h.id for h in srv.stubs.search.Search(q).hits} == set(acked)
    finally:
        srv.stop()
    log = srv.log_path.read_text(errors="replace")
    assert "bug in" not in log and "Traceback" not in log, log[-3000:]
    assert "retried at the next due write" in log  # failed checkpoints, requests answered OK

    srv.start()  # every acknowledged item is there after a restart
    try:
        got = srv.stubs.index.Get(index_pb2.GetRequest(collection="c", ids=acked))
        assert {it.id for it in got.items} == set(acked)
        info = srv.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c"))
        assert info.count == len(acked)
    finally:
        srv.stop()


@pytest.mark.e2e
def test_snapshot_to_a_full_or_read_only_destination_is_refused_and_removed(tmp_path):
    full, ro = tmp_path / "full", tmp_path / "ro"
    _mount(full, "1m")
    _mount(ro, "1m", "ro")
    srv = InProcessServer(tmp_path / "data", checkpoint_every=100)
    try:
        srv.stubs.index.CreateCollection(
            index_pb2.CreateCollectionRequest(name="c", dim=DIM, metric=index_pb2.METRIC_IP)
        )
        acked = [i for k in range(0, 2000, 200) for i in _upsert(srv.stubs, k, 200)]

        def refused(dest: Path) -> grpc.RpcError:
            with pytest.raises(grpc.RpcError) as err:
                srv.stubs.admin.Snapshot(admin_pb2.SnapshotRequest(dir=str(dest)), timeout=60)
            return err.value

        # a new directory on the full volume, then the (empty) volume itself
        for dest in (full / "snap", full):
            err = refused(dest)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            assert str(dest) in err.details() and "free of 1.0 MiB" in err.details()
            assert "removed" in err.details()
            assert float(dict(err.trailing_metadata())["retry-after"]) > 0
            assert list(full.iterdir()) == []  # nothing partial left, not even the directory
        for dest in (ro / "snap", ro):
            err = refused(dest)
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
            assert str(dest) in err.details() and "not writable" in err.details()

        q = search_pb2.SearchRequest(
            collection="c", vector=common_pb2.Vector(values=[1.0] * DIM), top_k=10_000
        )
        assert {h.id for h in srv.stubs.search.Search(q).hits} == set(acked)
        acked += _upsert(srv.stubs, len(acked), 20)  # the collection still takes writes
        ok = srv.stubs.admin.Snapshot(admin_pb2.SnapshotRequest(dir=str(tmp_path / "ok")))
        assert ok.bytes > 0
    finally:
        srv.stop()
        for vol in (full, ro):
            subprocess.run(["umount", "-l", str(vol)], check=False)
    restored = tmp_path / "restored"
    from ragplane.server.admin import AdminOps

    AdminOps.restore(tmp_path / "ok", restored)
    again = InProcessServer(restored)
    try:
        got = again.stubs.index.Get(index_pb2.GetRequest(collection="c", ids=acked))
        assert {it.id for it in got.items} == set(acked)
    finally:
        again.stop()


def _fill_volume(vol: Path) -> None:
    """Write a filler file until the volume has no room left."""
    with open(vol / "filler", "ab") as f:
        try:
            while True:
                f.write(os.urandom(1 << 16))
                f.flush()
        except OSError:
            pass


def _fill_evidence(store: EvidenceStore, vol: Path) -> None:
    _fill_volume(vol)
    with pytest.raises(StorageFull, match=str(vol)):
        for k in range(10_000):
            key = EvidenceKey("embeddings", f"r{k}", "c@1", "cpu x86_64 avx2")
            store.record_agreement(key, "short", [0.99] * 2000)


def test_evidence_store_refuses_then_recovers_on_a_full_disk(tmp_path):
    vol = tmp_path / "ev"
    _mount(vol, "1m")
    try:
        store = EvidenceStore(vol / "shadow.db")
        _fill_evidence(store, vol)
        with pytest.raises(StorageFull):
            store.set_serving("embeddings", "rust@1", "flip", False, "test")
        (vol / "filler").unlink()
        # a failed BEGIN ... COMMIT must not leave the connection inside a dead transaction
        store.set_serving("embeddings", "rust@1", "flip", False, "test")
        assert store.serving("embeddings") == "rust@1"
        store.close()
    finally:
        subprocess.run(["umount", "-l", str(vol)], check=False)


def test_key_store_refuses_then_recovers_on_a_full_disk(tmp_path):
    vol = tmp_path / "keys"
    _mount(vol, "1m")
    try:
        keys = KeyStore(vol / "keys.db")
        _fill_volume(vol)
        with pytest.raises(StorageFull, match=str(vol)):
            for k in range(1000):
                keys.create(f"t{k}", ["read"], description="d" * 4000)
        (vol / "filler").unlink()
        info, _ = keys.create("after", ["read"])
        assert info.key_id in {k.key_id for k in keys.list()}
        keys.close()
    finally:
        subprocess.run(["umount", "-l", str(vol)], check=False)


class _FullPublisher:
    def __init__(self) -> None:
        self.calls = 0
        self.published = threading.Event()

    def publish(self, result) -> None:
        self.calls += 1
        if self.calls == 1:
            raise StorageFull("the data directory 'd' is full")
        self.published.set()

    def dropped(self, name: str) -> None:
        raise StorageFull("the data directory 'd' is full")


def test_shadow_worker_survives_a_full_disk():
    pub = _FullPublisher()
    exp = Experiment(
        "embeddings",
        candidate=lambda inputs, control: (Observation("candidate", 1, None, 0.0), {}),
        compare=lambda a, b: (None, a == b),
        publisher=pub,
    )
    try:
        control = Observation("control", 1, None, 0.0)
        assert exp.offer("a", control) and exp.offer("b", control)
        assert pub.published.wait(30), "the worker died on the first failed publish"
        assert pub.calls == 2
    finally:
        exp.close()


def test_storage_faults_are_classified_from_real_errors(tmp_path):
    db = tmp_path / "ro.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as exc:
        ro.execute("INSERT INTO t VALUES (1)")
    ro.close()
    mapped = storage_error(exc.value, tmp_path)
    assert isinstance(mapped, StorageReadOnly) and str(tmp_path) in str(mapped)

    vol = tmp_path / "rofs"
    _mount(vol, "1m", "ro")
    try:
        with pytest.raises(OSError) as err:
            (vol / "f").write_bytes(b"x")
        assert isinstance(storage_error(err.value, vol), StorageReadOnly)
    finally:
        subprocess.run(["umount", "-l", str(vol)], check=False)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 512)
    with pytest.raises(sqlite3.DatabaseError) as bad:
        sqlite3.connect(junk).execute("SELECT * FROM sqlite_master").fetchall()
    assert isinstance(storage_error(bad.value, tmp_path), Corrupt)
    assert storage_error(sqlite3.OperationalError("no such table: t"), tmp_path) is None
    assert storage_error(ValueError("x"), tmp_path) is None
