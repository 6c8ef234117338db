"""Restart, crash and torn-checkpoint behaviour: nothing acknowledged is ever lost."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ragplane.core.errors import FailedPrecondition
from ragplane.index import Engine, IndexType, Metric, Record
from ragplane.index.faiss_index import checkpoint_files

from .vectors import brute_force, make_records, make_vectors

T = "default"
REPO = Path(__file__).resolve().parents[3]


def _ckpts(data: Path) -> list[Path]:
    return sorted((data / "indexes").rglob("*.faiss"))


def _assert_serves(eng: Engine, name: str, x: np.ndarray, ids: list[str], metric: Metric) -> None:
    info = eng.describe(T, name)
    assert info.count == len(ids)
    got = eng.get(T, name, ids, include_vectors=True)
    assert [r.id for r in got] == ids
    q = make_vectors(5, x.shape[1], seed=99)
    exp_s, exp_p = brute_force(x, q, 5, metric)
    for row, r in enumerate(eng.search(T, name, q, 5)):
        assert [h.id for h in r.hits] == [ids[p] for p in exp_p[row]]


@pytest.mark.parametrize("kind", [IndexType.FLAT, IndexType.HNSW])
def test_reopen_after_close(tmp_path, kind):
    data = tmp_path / "d"
    x = make_vectors(300, 8, seed=1)
    with Engine(data) as eng:
        eng.create_collection(T, "c", dim=8, metric=Metric.L2, index_type=kind, embedder="e")
        eng.upsert(T, "c", make_records(x))
        eng.delete(T, "c", ids=["id0"])
    assert len(_ckpts(data)) == 1  # close checkpointed
    with Engine(data) as eng:
        info = eng.describe(T, "c")
        assert (info.count, info.tombstones, info.index_type) == (299, 1, kind)
        _assert_serves(eng, "c", x[1:], [f"id{i}" for i in range(1, 300)], Metric.L2)
        eng.upsert(T, "c", [Record("new", np.ones(8, np.float32))])
    with Engine(data) as eng:
        assert eng.describe(T, "c").count == 300


def test_crash_copy_without_close_loses_nothing(tmp_path):
    data, copy = tmp_path / "d", tmp_path / "copy"
    eng = Engine(data, checkpoint_every=100)
    eng.create_collection(
        T, "c", dim=8, metric=Metric.COSINE, index_type=IndexType.HNSW, embedder="e"
    )
    x = make_vectors(350, 8, seed=2)
    recs = make_records(x)
    for lo in range(0, 350, 70):
        eng.upsert(T, "c", recs[lo : lo + 70])
    eng.delete(T, "c", ids=["id3", "id300"])
    eng.upsert(T, "c", [Record("id5", x[6], "moved")])
    # a checkpoint exists but covers less than the store holds: start-up must catch up
    (ckpt,) = _ckpts(data)
    assert "-s280-" in ckpt.name
    shutil.copytree(data, copy)  # the "crash": the engine is never closed for the copy
    eng.close()
    with Engine(copy) as eng2:
        keep = [i for i in range(350) if i not in (3, 300)]
        vecs = x[keep].copy()
        vecs[keep.index(5)] = x[6]
        _assert_serves(eng2, "c", vecs, [f"id{i}" for i in keep], Metric.COSINE)
        assert eng2.get(T, "c", ["id5"])[0].text == "moved"
        # id3 and the old id5 are in the checkpoint; id300 was deleted after it, so
        # catching up never re-adds it
        assert eng2.describe(T, "c").tombstones == 2


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from ragplane.index import Engine, IndexType, Metric, Record
    eng = Engine(sys.argv[1], checkpoint_every=40)
    try:
        eng.create_collection("default", "c", dim=8, metric=Metric.L2,
                              index_type=IndexType.HNSW, embedder="e")
    except Exception:
        pass
    rng = np.random.default_rng(0)
    i = 0
    while True:
        recs = [Record(f"k{i + j}", rng.standard_normal(8).astype(np.float32),
                       metadata={"n": i + j})
                for j in range(7)]
        eng.upsert("default", "c", recs)
        if i % 3 == 0:
            eng.delete("default", "c", ids=[f"k{i}"])
            print(f"del k{i}", flush=True)
        print(f"ack {i + 6}", flush=True)
        i += 7
    """
)


def test_sigkill_mid_writes_loses_no_acknowledged_write(tmp_path):
    data = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    acked, deleted = -1, set()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            kind, arg = line.split()
            if kind == "ack":
                acked = int(arg)
            else:
                deleted.add(arg)
            if acked >= 700:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert acked >= 700
    with Engine(data) as eng:
        want = [f"k{i}" for i in range(acked + 1) if f"k{i}" not in deleted]
        got = {r.id for r in eng.get(T, "c", want)}
        assert got == set(want)
        assert not eng.get(T, "c", sorted(deleted))
        # every live stored vector is searchable: it finds itself first
        recs = eng.get(T, "c", want[-50:], include_vectors=True)
        res = eng.search(T, "c", np.stack([r.vector for r in recs]), 1)
        assert [r.hits[0].id for r in res] == [r.id for r in recs]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_torn_checkpoint_falls_back_to_store(tmp_path, damage):
    data = tmp_path / "d"
    x = make_vectors(200, 8, seed=3)
    with Engine(data) as eng:
        eng.create_collection(
            T, "c", dim=8, metric=Metric.IP, index_type=IndexType.HNSW, embedder="e"
        )
        eng.upsert(T, "c", make_records(x))
    (ckpt,) = _ckpts(data)
    raw = ckpt.read_bytes()
    if damage == "truncate":
        ckpt.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        ckpt.write_bytes(raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:])
    else:
        ckpt.write_bytes(b"")
    (ckpt.parent / ".tmp-g1-s5-00000000.faiss-1-0").write_bytes(b"half a write")
    with Engine(data) as eng:
        _assert_serves(eng, "c", x, [f"id{i}" for i in range(200)], Metric.IP)
    names = [p.name for p in ckpt.parent.iterdir()]
    assert not any(n.startswith(".tmp") for n in names)  # leftovers cleaned at open
    assert len(names) == 1


def test_checkpoint_every_writes_a_new_checkpoint(tmp_path):
    data = tmp_path / "d"
    with Engine(data, checkpoint_every=50) as eng:
        eng.create_collection(
            T, "c", dim=4, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
        )
        recs = make_records(make_vectors(120, 4))
        eng.upsert(T, "c", recs[:30])
        assert _ckpts(data) == []
        eng.upsert(T, "c", recs[30:60])
        (first,) = _ckpts(data)
        eng.upsert(T, "c", recs[60:120])
        files = checkpoint_files(first.parent, 1)
        assert len(files) == 1 and files[0][0] > int(first.name.split("-s")[1].split("-")[0])


def test_data_dir_in_use_is_refused(tmp_path):
    with Engine(tmp_path / "d"):
        with pytest.raises(FailedPrecondition, match="in use"):
            Engine(tmp_path / "d")
    Engine(tmp_path / "d").close()  # free again once closed


def test_orphan_index_files_are_removed_at_open(tmp_path):
    data = tmp_path / "d"
    with Engine(data) as eng:
        eng.create_collection(
            T, "c", dim=4, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
        )
        eng.upsert(T, "c", make_records(make_vectors(10, 4)))
    (ckpt,) = _ckpts(data)
    stray_gen = ckpt.parent / "g7-s3-00000000.faiss"
    stray_gen.write_bytes(b"x")
    stray_dir = data / "indexes" / "999"
    stray_dir.mkdir()
    (stray_dir / "g1-s1-00000000.faiss").write_bytes(b"x")
    with Engine(data) as eng:
        assert eng.describe(T, "c").count == 10
    assert not stray_gen.exists() and not stray_dir.exists()
