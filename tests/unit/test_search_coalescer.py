"""The search coalescer: concurrent searches of a large collection share one engine call;
a small collection's searches run at once, each its own (their scan costs less than the
hand-off); an engine error reaches every caller of its batch; a bad query is refused before it
would join one."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.index import Engine, IndexType, Metric, Record
from ragplane.index.types import Hit, SearchResult
from ragplane.server.collections import CollectionService
from ragplane.server.search_batcher import SearchCoalescer


class _Engine:
    """Answers each query row with one hit named by its first value; the first call
    blocks until `release` is set, so the searches that arrive meanwhile queue."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = fail

    def search(self, tenant, name, queries, top_k, **_kw) -> list[SearchResult]:
        first = not self.batches
        self.batches.append(len(queries))
        if first:
            self.entered.set()
            assert self.release.wait(10)
        if self.fail:
            raise RuntimeError("engine failed")
        return [SearchResult([Hit(str(int(q[0])), 1.0)], 1, True) for q in queries]


def _query(i: int) -> np.ndarray:
    return np.full(4, float(i), dtype=np.float32)


def _searches(c: SearchCoalescer, ids: range, vectors: int, pool: ThreadPoolExecutor) -> list:
    return [pool.submit(c.search, "t", "c", _query(i), 1, filter=None, include_text=False,
                        include_metadata=False, vectors=vectors) for i in ids]  # fmt: skip


def _queued_behind_a_first(c: SearchCoalescer, engine: _Engine, n: int, vectors: int,
                           pool: ThreadPoolExecutor) -> list:  # fmt: skip
    """One search that the engine holds, `n - 1` more queued behind it, then released."""
    first = _searches(c, range(1), vectors, pool)
    assert engine.entered.wait(10)
    rest = _searches(c, range(1, n), vectors, pool)
    while sum(len(w.waiting) for w in c._lanes.values()) < n - 1:  # all of them queued
        threading.Event().wait(0.01)
    engine.release.set()
    return first + rest


def test_a_large_collections_concurrent_searches_share_engine_calls():
    engine = _Engine()
    c = SearchCoalescer(engine, max_batch=64, min_vectors=1000)  # type: ignore[arg-type]
    with ThreadPoolExecutor(16) as pool:
        results = [f.result(10) for f in _queued_behind_a_first(c, engine, 16, 1000, pool)]
    assert [r.hits[0].id for r in results] == [str(i) for i in range(16)]  # each its own
    assert engine.batches == [1, 15] and (c.calls, c.queries) == (2, 16)


def test_a_small_collections_searches_run_at_once_each_its_own_call():
    engine = _Engine()
    c = SearchCoalescer(engine, max_batch=64, min_vectors=1000)  # type: ignore[arg-type]
    with ThreadPoolExecutor(16) as pool:
        first = _searches(c, range(1), 999, pool)
        assert engine.entered.wait(10)
        # with the first still in the engine, the others neither queue behind it nor batch
        rest = [f.result(10) for f in _searches(c, range(1, 16), 999, pool)]
        assert not first[0].done()
        engine.release.set()
        assert first[0].result(10).hits[0].id == "0"
    assert [r.hits[0].id for r in rest] == [str(i) for i in range(1, 16)]
    assert engine.batches == [1] * 16


def test_min_vectors_zero_coalesces_every_collection():
    engine = _Engine()
    c = SearchCoalescer(engine, max_batch=64, min_vectors=0)  # type: ignore[arg-type]
    with ThreadPoolExecutor(8) as pool:
        done = [f.result(10).hits[0].id for f in _queued_behind_a_first(c, engine, 8, 1, pool)]
    assert done == [str(i) for i in range(8)] and engine.batches == [1, 7]


def test_an_engine_error_reaches_every_caller_of_its_batch():
    engine = _Engine(fail=True)
    c = SearchCoalescer(engine, max_batch=64, min_vectors=1000)  # type: ignore[arg-type]
    with ThreadPoolExecutor(8) as pool:
        for f in _queued_behind_a_first(c, engine, 8, 5000, pool):
            with pytest.raises(RuntimeError, match="engine failed"):
                f.result(10)
    assert engine.batches == [1, 7] and not c._lanes  # one batch failed, nothing left


class _Held:
    """A real engine whose first search waits for `release`, so later searches queue."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.batches: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def search(self, tenant, name, queries, top_k, **kw):
        self.batches.append(len(queries))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return self._engine.search(tenant, name, queries, top_k, **kw)


def test_a_bad_query_fails_alone_not_the_batch_it_would_join(tmp_path):
    """CollectionService checks a vector query before it may be coalesced (the collection
    described only then): a NaN or wrong-sized query is refused on its own, and the good
    queries queued beside it are answered in one engine call."""
    real = Engine(tmp_path / "data")
    try:
        real.create_collection("default", "c", dim=4, metric=Metric.COSINE,
                               index_type=IndexType.FLAT, embedder="e@1")  # fmt: skip
        real.upsert("default", "c", [Record(str(i), _query(i + 1)) for i in range(4)])
        held = _Held(real)
        # no embedder: vector queries only
        service = CollectionService(held, None, search_coalesce_min_vectors=0)  # type: ignore

        def search(vector):
            return service.search("c", text=None, vector=vector, top_k=2, filter=None,
                                  include_text=False, include_metadata=False)[0]  # fmt: skip

        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(search, _query(1))
            assert held.entered.wait(10)
            nan = pool.submit(search, np.array([1, np.nan, 0, 0], dtype=np.float32))
            short = pool.submit(search, np.ones(3, dtype=np.float32))
            good = [pool.submit(search, _query(i)) for i in (2, 3)]
            while sum(len(lane.waiting) for lane in service.searches._lanes.values()) < 2:
                threading.Event().wait(0.01)
            held.release.set()
            assert all(len(f.result(10).hits) == 2 for f in [first, *good])
            with pytest.raises(InvalidArgument, match="NaN or infinity"):
                nan.result(10)
            with pytest.raises(InvalidArgument, match="dimension 3, collection 'c' expects 4"):
                short.result(10)
        assert held.batches == [1, 2]  # the good ones batched; the bad never reached it
    finally:
        real.close()
