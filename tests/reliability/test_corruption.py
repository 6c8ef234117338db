"""A damaged ragplane.db: the server refuses to start, names the file and the way back
(`ragplane admin restore`), and the restored snapshot serves every item again."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ragplane.core.errors import Corrupt
from ragplane.index import Engine
from ragplane.index.store import DB_NAME
from ragplane.testkit.harness import ROOT, SubprocessServer
from ragplane.v1 import admin_pb2, common_pb2, index_pb2

pytestmark = pytest.mark.e2e

DIM = 32
PAGE = 4096


def _fill(stubs, n: int) -> list[str]:
    rng = np.random.default_rng(7)
    stubs.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name="c", dim=DIM, metric=index_pb2.METRIC_IP)
    )
    ids = [f"i{k}" for k in range(n)]
    for lo in range(0, n, 500):
        items = [
            common_pb2.Item(id=i, vector=rng.standard_normal(DIM).tolist(), text=f"text {i}")
            for i in ids[lo : lo + 500]
        ]
        stubs.index.Upsert(index_pb2.UpsertRequest(collection="c", items=items))
    return ids


def _damage(db: os.PathLike, pages: int = 4) -> None:
    """Overwrite `pages` pages in the middle of the file with noise, as a torn or bad-sector
    write would leave them."""
    size = os.path.getsize(db)
    assert size > 16 * PAGE, "the store is too small to damage its middle"
    rng = random.Random(20261201)
    with open(db, "r+b") as f:
        f.seek((size // PAGE // 2) * PAGE)
        f.write(rng.randbytes(pages * PAGE))


def test_a_damaged_store_stops_the_start_and_restore_brings_it_back(tmp_path):
    data, snap = tmp_path / "data", tmp_path / "snap"
    srv = SubprocessServer(data)
    srv.start()
    try:
        ids = _fill(srv.stubs, 3000)
        srv.stubs.admin.Snapshot(admin_pb2.SnapshotRequest(dir=str(snap)))
    finally:
        srv.stop()  # a clean stop folds the WAL into ragplane.db

    _damage(data / DB_NAME)
    with pytest.raises(RuntimeError) as exc:
        srv.start()
    refusal = " ".join(str(exc.value).split())  # the CLI wraps long lines
    assert "is damaged" in refusal and "quick_check" in refusal, refusal
    assert str(data / DB_NAME) in refusal and "ragplane admin restore" in refusal, refusal

    with pytest.raises(Corrupt, match="integrity_check"):
        Engine(data, integrity_check="full")

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragplane.server.cli",
            "admin",
            "restore",
            str(snap),
            "--data-dir",
            str(data),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    srv.start()
    try:
        got = srv.stubs.index.Get(index_pb2.GetRequest(collection="c", ids=ids))
        assert {it.id for it in got.items} == set(ids)
    finally:
        srv.stop()


def test_a_sound_store_passes_both_checks(tmp_path):
    data = tmp_path / "data"
    srv = SubprocessServer(data)
    srv.start()
    try:
        _fill(srv.stubs, 600)
    finally:
        srv.stop()
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    for check in ("quick", "full"):
        with Engine(copy, integrity_check=check) as engine:
            assert engine.list_all_collections()[0].count == 600
