"""The request core (ragplane.core.cpus): which core the setting picks, that pinned threads
stay on it, that `wide()` frees a pinned thread for GIL-free work and lets the threads it
starts run anywhere, and that a server pins gRPC's threads and widens its FAISS searches."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from ragplane.core import cpus
from ragplane.core.errors import InvalidArgument

CORES = frozenset({0, 1, 2, 3})
many_cores = pytest.mark.skipif(
    len(cpus.allowed()) < 2, reason="pinning needs a process allowed on two cores or more"
)


def test_auto_claims_an_allowed_core_from_the_one_the_process_id_picks():
    tried: list[list[int]] = []

    def first_free(candidates):
        tried.append(list(candidates))
        return candidates[1]  # the first is another server's

    assert cpus.choose("auto", CORES, pid=6, claim=first_free) == {3}
    assert tried == [[2, 3, 0, 1]]
    assert cpus.choose("AUTO", frozenset({4, 9}), pid=7, claim=lambda c: c[0]) == {9}
    assert cpus.choose("auto", CORES, claim=lambda c: None) is None  # every core claimed
    assert cpus.choose("auto", frozenset({5}), pid=1) is None  # one core: nothing to gain
    assert cpus.choose("off", CORES) is None


def test_servers_on_one_machine_claim_a_core_each(tmp_path):
    import fcntl

    other = open(tmp_path / "core-2.lock", "a")  # another server holds core 2
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert cpus.claim_core([2, 3, 0], tmp_path) == 3
        assert cpus.claim_core([0, 1], tmp_path) == 3  # one claim a process, kept
        mine = open(tmp_path / "core-3.lock", "a")  # and held: a third process cannot
        with pytest.raises(OSError):
            fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mine.close()
        full = tmp_path / "full"
        full.mkdir()
        held = open(full / "core-2.lock", "a")
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cpus.claim_core([2], full) is None  # every core claimed: no pinning
        held.close()
    finally:
        other.close()
        for d in (tmp_path, tmp_path / "full"):
            claim = cpus._claims.pop(d, None)
            if claim is not None:
                claim[1].close()


def test_named_cores_must_be_allowed_and_numbers():
    assert cpus.choose("1,3", CORES) == {1, 3}
    with pytest.raises(InvalidArgument, match=r"may not run on; it may run on 0,1,2,3"):
        cpus.choose("7", CORES)
    with pytest.raises(InvalidArgument, match="not auto, off or a list of core numbers"):
        cpus.choose("fast", CORES)


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


@many_cores
def test_a_pinned_thread_runs_on_its_core_and_wide_frees_it_and_its_children():
    every = cpus.allowed()
    core = frozenset({max(every)})
    rc = cpus.RequestCores(core)

    def pinned_thread():
        rc.pin_this_thread()
        seen = {"pinned": os.sched_getaffinity(0)}
        seen["child of pinned"] = _in_thread(lambda: os.sched_getaffinity(0))
        with rc.wide():
            seen["wide"] = os.sched_getaffinity(0)
            with rc.wide():  # nested: the inner one does nothing, the outer restores
                pass
            seen["after nested"] = os.sched_getaffinity(0)
            seen["child of wide"] = _in_thread(lambda: os.sched_getaffinity(0))
        seen["after"] = os.sched_getaffinity(0)
        return seen

    seen = _in_thread(pinned_thread)
    assert seen["pinned"] == core and seen["after"] == core
    assert seen["child of pinned"] == core  # inherited: why rebuilds start inside wide()
    assert seen["wide"] == every and seen["after nested"] == every
    assert seen["child of wide"] == every
    # a thread that was never pinned is left alone
    with rc.wide():
        assert os.sched_getaffinity(0) == every


@many_cores
def test_a_server_pins_grpc_threads_and_searches_on_every_core(tmp_path, monkeypatch):
    from ragplane.index import search
    from ragplane.testkit.harness import InProcessServer
    from ragplane.v1 import common_pb2, index_pb2, search_pb2

    every = cpus.allowed()
    core = min(every)
    during: list[set[int]] = []
    run_wide = search._run_wide

    def spy(*args, **kwargs):
        during.append(os.sched_getaffinity(0))
        return run_wide(*args, **kwargs)

    monkeypatch.setattr(search, "_run_wide", spy)
    srv = InProcessServer(tmp_path / "data", rpc_cpus=str(core))
    try:
        s = srv.stubs
        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c", dim=4))
        vecs = np.eye(4, dtype=np.float32)
        s.index.Upsert(index_pb2.UpsertRequest(collection="c", items=[
            common_pb2.Item(id=str(i), vector=v.tolist()) for i, v in enumerate(vecs)]))
        hits = s.search.Search(search_pb2.SearchRequest(
            collection="c", vector=common_pb2.Vector(values=[0, 1, 0, 0]), top_k=1)).hits
        assert [h.id for h in hits] == ["1"]
        masks = {t.name: os.sched_getaffinity(t.native_id) for t in threading.enumerate()
                 if t.native_id is not None}
        handlers = [m for name, m in masks.items() if name.startswith("rpc_")]
        assert handlers and all(m == {core} for m in handlers), masks
        polling = [m for name, m in masks.items() if name.endswith("(_serve)")]
        assert polling == [{core}], masks  # gRPC's polling thread, pinned on its first call
        assert during == [every]  # the search's FAISS work, on any core
        assert os.sched_getaffinity(0) == every  # the test's own thread, untouched
    finally:
        srv.stop()
    with pytest.raises(InvalidArgument, match="may not run on"):
        InProcessServer(tmp_path / "other", rpc_cpus=str(max(every) + 1))
