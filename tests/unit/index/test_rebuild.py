"""Generations: rebuild under load, recall refusal, re-embedding, rollback, compaction,
snapshot / restore, and a rebuild interrupted by a crash."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time

import faiss
import numpy as np
import pytest

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.index import Engine, Filter, IndexParams, IndexType, Metric, RebuildProgress, Record
from ragplane.index.types import Condition, FilterOp, SearchKnobs

from .vectors import brute_force, make_records, make_vectors, normalise

T = "default"


def _fill(eng: Engine, n: int, dim: int = 16, index_type=IndexType.FLAT, metric=Metric.COSINE,
          seed=0):
    eng.create_collection(T, "c", dim=dim, metric=metric, index_type=index_type, embedder="old@1")
    x = make_vectors(n, dim, seed=seed)
    recs = make_records(x, metadata=lambda i: {"i": i})
    for lo in range(0, n, 1000):
        eng.upsert(T, "c", recs[lo : lo + 1000])
    return x


def _ntotal(eng: Engine) -> int:
    return eng._colls[(T, "c")].index.ntotal  # white-box: what the FAISS index holds


def test_rebuild_under_concurrent_upserts_and_searches(engine):
    dim = 16
    _fill(engine, 3000, dim)
    written: list[str] = []
    errors: list[BaseException] = []
    searches = 0
    stop = threading.Event()
    delta_seen = threading.Event()

    def writer():
        i = 0
        try:
            while not stop.is_set():
                v = make_vectors(20, dim, seed=1000 + i)
                ids = [f"w{i}-{j}" for j in range(20)]
                engine.upsert(T, "c", [Record(k, v[j], "w") for j, k in enumerate(ids)])
                written.extend(ids)
                i += 1
                if i >= 5:
                    delta_seen.set()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    def searcher():
        nonlocal searches
        q = make_vectors(4, dim, seed=7)
        try:
            while not stop.is_set():
                res = engine.search(
                    T, "c", q, 10, filter=Filter(must=(Condition("i", FilterOp.LT, 2000),))
                )
                assert all(r.returned_k == 10 for r in res)
                assert all(r.returned_k == 10 for r in engine.search(T, "c", q, 10))
                searches += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    reports: list[RebuildProgress] = []

    def progress(p: RebuildProgress):
        reports.append(p)
        if p.phase == "indexing" and p.done == 0:
            # make sure upserts land between the snapshot and the swap
            assert delta_seen.wait(20)

    threads = [threading.Thread(target=writer), threading.Thread(target=searcher)]
    for t in threads:
        t.start()
    try:
        info = engine.rebuild(T, "c", index_type=IndexType.HNSW, progress=progress)
        time.sleep(0.2)  # writes and searches against the new generation too
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert searches > 0
    assert info.generation == 2 and info.index_type == IndexType.HNSW
    final = engine.describe(T, "c")
    assert final.count == 3000 + len(written)
    assert _ntotal(engine) == final.count and final.tombstones == 0  # no lost upserts
    # each upsert is in the new generation: its own vector finds it
    got = engine.get(T, "c", written, include_vectors=True)
    assert len(got) == len(written)
    res = engine.search(T, "c", np.stack([r.vector for r in got]), 1)
    found = sum(r.hits[0].id == g.id for r, g in zip(res, got, strict=True))
    assert found >= 0.99 * len(got)
    phases = [p.phase for p in reports]
    assert phases[0] == "indexing" and "checking" in phases and phases[-1] == "swapped"
    assert reports[-1].recall is not None and reports[-1].recall >= 0.95
    assert any(p.rate > 0 for p in reports if p.phase == "indexing")


def test_refused_rebuild_keeps_old_generation(engine):
    dim = 64
    _fill(engine, 3000, dim, metric=Metric.L2)
    reports: list[RebuildProgress] = []
    weak = IndexParams(hnsw_m=2, hnsw_ef_construction=8, hnsw_ef_search=1)
    with pytest.raises(
        FailedPrecondition, match=r"recall@10 0\.\d+, below the required 0\.99; generation 1"
    ):
        engine.rebuild(
            T, "c", index_type=IndexType.HNSW, params=weak, min_recall=0.99, progress=reports.append
        )
    assert reports[-1].phase == "refused" and reports[-1].recall < 0.99
    info = engine.describe(T, "c")
    assert (info.generation, info.index_type) == (1, IndexType.FLAT)
    assert engine.search(T, "c", make_vectors(1, dim), 5)[0].exhaustive
    # the failed generation left nothing behind, and the next rebuild gets a fresh number
    assert engine.rebuild(T, "c", min_recall=1.0).generation == 3


def test_rollback(engine):
    x = _fill(engine, 1000, 8, metric=Metric.IP)
    engine.rebuild(T, "c", index_type=IndexType.HNSW)
    engine.upsert(T, "c", [Record("late", np.ones(8, np.float32))])
    engine.delete(T, "c", ids=["id1"])
    info = engine.rollback(T, "c")
    assert (info.generation, info.index_type, info.count) == (1, IndexType.FLAT, 1000)
    res = engine.search(T, "c", x[:3], 5)
    assert all(r.exhaustive for r in res)
    assert engine.get(T, "c", ["late"]) and not engine.get(T, "c", ["id1"])
    assert _ntotal(engine) >= 1000
    with pytest.raises(FailedPrecondition, match="no previous generation"):
        engine.rollback(T, "c")


def test_rollback_survives_restart(tmp_path):
    data = tmp_path / "d"
    with Engine(data) as eng:
        _fill(eng, 500, 8)
        eng.rebuild(T, "c", index_type=IndexType.HNSW)
    with Engine(data) as eng:
        assert eng.describe(T, "c").index_type == IndexType.HNSW
        assert eng.rollback(T, "c").index_type == IndexType.FLAT
    with Engine(data) as eng:
        info = eng.describe(T, "c")
        assert (info.generation, info.index_type, info.count) == (1, IndexType.FLAT, 500)


def _fake_embedder(dim: int, salt: int):
    def embed(texts: list[str]) -> np.ndarray:
        return np.stack(
            [
                np.random.default_rng(abs(hash((t, salt))) % (1 << 32)).standard_normal(dim)
                for t in texts
            ]
        ).astype(np.float32)

    return embed


def test_reembed_rebuild_and_rollback_restore_vectors(engine):
    dim = 8
    x = _fill(engine, 600, dim)
    new = _fake_embedder(dim, 2)
    calls: list[int] = []

    def reembed(texts):
        calls.append(len(texts))
        if len(calls) == 2:  # an upsert arriving mid-rebuild is re-embedded before the swap
            engine.upsert(T, "c", [Record("mid", np.ones(dim, np.float32), "mid text")])
        return new(texts)

    reports: list[RebuildProgress] = []
    with pytest.raises(InvalidArgument, match="needs reembed"):
        engine.rebuild(T, "c", embedder="new@2")
    info = engine.rebuild(T, "c", reembed=reembed, embedder="new@2", progress=reports.append)
    assert info.embedder == "new@2" and info.count == 601
    assert max(calls) <= 256
    emb = [p for p in reports if p.phase == "embedding"]
    assert emb[-1].done == emb[-1].total == 600 and emb[-1].eta_seconds == 0
    (rec,) = engine.get(T, "c", ["id7"], include_vectors=True)
    np.testing.assert_allclose(rec.vector, normalise(new(["text 7"])[0]), rtol=1e-5)
    (mid,) = engine.get(T, "c", ["mid"], include_vectors=True)
    np.testing.assert_allclose(mid.vector, normalise(new(["mid text"])[0]), rtol=1e-5)
    (res,) = engine.search(T, "c", new(["text 9"]), 1)
    assert res.hits[0].id == "id9"

    info = engine.rollback(T, "c")
    assert info.embedder == "old@1" and info.generation == 1
    (rec,) = engine.get(T, "c", ["id7"], include_vectors=True)
    np.testing.assert_allclose(rec.vector, normalise(x[7]), rtol=1e-5)
    (res,) = engine.search(T, "c", x[9], 1)
    assert res.hits[0].id == "id9"


def test_reembed_with_bad_output_is_refused(engine):
    _fill(engine, 50, 8)
    with pytest.raises(FailedPrecondition, match="shape"):
        engine.rebuild(T, "c", reembed=lambda texts: np.zeros((1, 8)), embedder="x@1")
    assert engine.describe(T, "c").generation == 1


class _Bulk:
    """A BulkReembed: takes every batch at once (as a cluster would), catches up singly."""

    where = "on the test's cluster"

    def __init__(self, embed, drop_last: bool = False) -> None:
        self.embed, self.drop_last = embed, drop_last
        self.streamed: list[int] = []
        self.called: list[int] = []

    def __call__(self, texts):
        self.called.append(len(texts))
        return self.embed(texts)

    def stream(self, batches):
        batches = list(batches)  # all of them before the first result
        self.streamed = [len(b) for b in batches]
        for b in batches[: -1 if self.drop_last else None]:
            yield self.embed(b)


def test_a_bulk_reembed_gets_every_batch_at_once_and_says_where_it_ran(engine):
    dim = 8
    _fill(engine, 600, dim)
    bulk = _Bulk(_fake_embedder(dim, 3))
    reports: list[RebuildProgress] = []
    info = engine.rebuild(T, "c", reembed=bulk, embedder="new@3", progress=reports.append)
    assert info.embedder == "new@3" and info.count == 600
    assert bulk.streamed == [256, 256, 88] and bulk.called == []
    emb = [p for p in reports if p.phase == "embedding" and p.done]
    assert [p.done for p in emb] == [256, 512, 600]
    assert all(p.message == "on the test's cluster" for p in emb)
    (rec,) = engine.get(T, "c", ["id5"], include_vectors=True)
    np.testing.assert_allclose(rec.vector, normalise(bulk.embed(["text 5"])[0]), rtol=1e-5)


def test_a_bulk_reembed_that_loses_a_batch_is_refused(engine):
    _fill(engine, 300, 8)
    with pytest.raises(FailedPrecondition, match="no vectors for 44 texts"):
        engine.rebuild(T, "c", reembed=_Bulk(_fake_embedder(8, 4), drop_last=True),
                       embedder="x@1")
    assert engine.describe(T, "c").generation == 1


def test_ivf_pq_trains_at_rebuild_and_falls_back_to_flat(engine):
    engine.create_collection(
        T, "c", dim=16, metric=Metric.L2, index_type=IndexType.IVF_PQ, embedder="e"
    )
    x = make_vectors(3000, 16, seed=3, clusters=30)
    engine.upsert(T, "c", make_records(x[:100], metadata=lambda i: {"i": i}))
    (res,) = engine.search(T, "c", x[0], 5)
    assert res.exhaustive  # untrained: served by an exact flat index
    notes: list[str] = []
    engine.rebuild(T, "c", progress=lambda p: notes.append(p.message))
    assert any("too few to train ivf_pq" in m for m in notes)
    engine.upsert(T, "c", make_records(x, metadata=lambda i: {"i": i})[100:])
    info = engine.rebuild(T, "c", min_recall=0.5)
    assert info.index_type == IndexType.IVF_PQ and info.params.ivf_nlist > 1
    res = engine.search(T, "c", x[:20], 10)
    assert all(not r.exhaustive and r.returned_k == 10 for r in res)
    # a selective filter on ivf_pq scores every matching code, then rescores exactly
    (res,) = engine.search(T, "c", x[0], 5, filter=Filter(must=(Condition("i", FilterOp.LT, 50),)))
    exp_s, exp_p = brute_force(x[:50], x[:1], 5, Metric.L2)
    assert not res.exhaustive and [h.id for h in res.hits] == [f"id{p}" for p in exp_p[0]]
    # exact: true reads the stored float vectors and says so
    (res,) = engine.search(T, "c", x[0], 5, filter=Filter(must=(Condition("i", FilterOp.LT, 50),)),
                           knobs=SearchKnobs(exact=True))
    assert res.exhaustive and [h.id for h in res.hits] == [f"id{p}" for p in exp_p[0]]


def test_compact_drops_tombstones(tmp_path):
    data = tmp_path / "d"
    with Engine(data) as eng:
        x = _fill(eng, 1000, 8, index_type=IndexType.HNSW)
        eng.create_collection(
            T, "other", dim=4, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
        )
        eng.upsert(T, "other", make_records(make_vectors(10, 4)))
        eng.delete(T, "other", ids=["id0"])
        eng.delete(T, "c", ids=[f"id{i}" for i in range(100)])
        eng.upsert(T, "c", make_records(x)[100:150])  # replacements: 50 more tombstones
        assert eng.describe(T, "c").tombstones == 150
        q = make_vectors(5, 8, seed=4)
        before = [[h.id for h in r.hits] for r in eng.search(T, "c", q, 10)]
        assert eng.compact(T, "c") == 150
        info = eng.describe(T, "c")
        assert (info.count, info.tombstones) == (900, 0) and _ntotal(eng) == 900
        assert [[h.id for h in r.hits] for r in eng.search(T, "c", q, 10)] == before
        assert eng.compact(T) == 1  # tenant-wide: only "other" had tombstones left
        assert eng.compact(T) == 0
        (n,) = (
            sqlite3.connect(eng.db_path)
            .execute("SELECT COUNT(*) FROM items WHERE deleted = 1")
            .fetchone()
        )
        assert n == 0
    with Engine(data) as eng:
        assert eng.describe(T, "c").tombstones == 0


def test_snapshot_and_restore(tmp_path):
    data, snap, restored = tmp_path / "d", tmp_path / "snap", tmp_path / "r"
    with Engine(data) as eng:
        x = _fill(eng, 500, 8, index_type=IndexType.HNSW)
        eng.rebuild(T, "c", index_type=IndexType.FLAT)
        size = eng.snapshot(snap)
        assert size > 0
        eng.upsert(T, "c", [Record("after", np.ones(8, np.float32))])
        with pytest.raises(InvalidArgument, match="not empty"):
            eng.snapshot(snap)
        with pytest.raises(FailedPrecondition, match="in use"):
            Engine.restore(snap, data)
    Engine.restore(snap, restored)
    with Engine(restored) as eng:
        info = eng.describe(T, "c")
        assert (info.count, info.generation, info.index_type) == (500, 2, IndexType.FLAT)
        assert not eng.get(T, "c", ["after"])
        (res,) = eng.search(T, "c", x[3], 1)
        assert res.hits[0].id == "id3"
        assert (
            eng.rollback(T, "c").index_type == IndexType.HNSW
        )  # the previous generation came along
        eng.upsert(T, "c", [Record("new", np.ones(8, np.float32))])
    # restoring over a stopped data directory replaces it
    Engine.restore(snap, data)
    with Engine(data) as eng:
        assert not eng.get(T, "c", ["after"]) and eng.describe(T, "c").count == 500
    with pytest.raises(InvalidArgument, match="not a snapshot"):
        Engine.restore(tmp_path / "nothing", tmp_path / "x")


def test_rebuild_interrupted_by_crash_serves_old_generation(tmp_path):
    data, crashed = tmp_path / "d", tmp_path / "crashed"
    with Engine(data) as eng:
        x = _fill(eng, 800, 8)
        new = _fake_embedder(8, 5)

        def progress(p: RebuildProgress):
            if p.phase == "checking" and not crashed.exists():
                shutil.copytree(data, crashed)  # the process "dies" here: staged vectors, no swap

        eng.rebuild(
            T, "c", index_type=IndexType.HNSW, reembed=new, embedder="new@1", progress=progress
        )
    with Engine(crashed) as eng:
        info = eng.describe(T, "c")
        assert (info.generation, info.index_type, info.embedder) == (1, IndexType.FLAT, "old@1")
        (rec,) = eng.get(T, "c", ["id4"], include_vectors=True)
        np.testing.assert_allclose(rec.vector, normalise(x[4]), rtol=1e-5)
        con = sqlite3.connect(eng.db_path)
        assert con.execute("SELECT COUNT(*) FROM staged_vectors").fetchone() == (0,)
        assert con.execute("SELECT state FROM generations WHERE generation = 2").fetchone() == (
            "failed",
        )
        con.close()
        assert not list((crashed / "indexes").rglob("g2-*"))
        # and a new rebuild works
        assert eng.rebuild(T, "c", index_type=IndexType.HNSW).generation == 3


def test_one_rebuild_at_a_time_and_cancel(engine):
    _fill(engine, 300, 8)
    inner: list[BaseException] = []

    def progress(p: RebuildProgress):
        if p.phase == "indexing" and p.done == 0:
            try:
                engine.rebuild(T, "c")
            except FailedPrecondition as e:
                inner.append(e)
            raise KeyboardInterrupt  # a cancelled stream: the rebuild must undo itself

    with pytest.raises(KeyboardInterrupt):
        engine.rebuild(T, "c", index_type=IndexType.HNSW, progress=progress)
    assert inner and "already running" in str(inner[0])
    assert engine.describe(T, "c").generation == 1
    assert engine.rebuild(T, "c", index_type=IndexType.HNSW).generation == 3


def test_rebuild_argument_errors_and_empty_collection(engine):
    engine.create_collection(
        T, "c", dim=8, metric=Metric.L2, index_type=IndexType.FLAT, embedder="e"
    )
    with pytest.raises(InvalidArgument, match="pq_m 3 must divide"):
        engine.rebuild(T, "c", index_type=IndexType.IVF_PQ, params=IndexParams(pq_m=3))
    with pytest.raises(InvalidArgument, match="min_recall"):
        engine.rebuild(T, "c", min_recall=1.5)
    with pytest.raises(InvalidArgument, match="unknown index_type"):
        engine.rebuild(T, "c", index_type="annoy")
    info = engine.rebuild(T, "c", index_type=IndexType.HNSW)  # nothing to index is fine
    assert (info.generation, info.count) == (2, 0)
    engine.upsert(T, "c", [Record("a", np.ones(8, np.float32))])
    assert engine.search(T, "c", np.ones(8), 1)[0].hits[0].id == "a"


def test_snapshot_during_writes_is_consistent(tmp_path):
    data, snap, restored = tmp_path / "d", tmp_path / "snap", tmp_path / "r"
    stop = threading.Event()
    errors: list[BaseException] = []
    with Engine(data) as eng:
        _fill(eng, 300, 8, index_type=IndexType.HNSW)

        def writer():
            i = 0
            try:
                while not stop.is_set():
                    v = make_vectors(5, 8, seed=500 + i)
                    eng.upsert(T, "c", [Record(f"w{i}-{j}", v[j]) for j in range(5)])
                    eng.delete(T, "c", ids=[f"id{i}"])
                    i += 1
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.1)
        try:
            eng.snapshot(snap)
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors
    Engine.restore(snap, restored)
    with Engine(restored) as eng:
        info = eng.describe(T, "c")
        recs = [r for batch in eng.iter_records(T, "c") for r in batch]
        assert len(recs) == info.count > 300
        res = eng.search(T, "c", np.stack([r.vector for r in recs]), 1)
        found = sum(r.hits[0].id == rec.id for r, rec in zip(res, recs, strict=True))
        assert found >= 0.99 * len(recs)
        # the restored index never holds a vector the restored store lacks
        index_ids = faiss.vector_to_array(eng._colls[(T, "c")].index.id_map).tolist()
        con = sqlite3.connect(eng.db_path)
        stored = {s for (s,) in con.execute("SELECT seq FROM items")}
        con.close()
        assert set(index_ids) <= stored
