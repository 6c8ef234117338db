"""Batched flat searches take the numpy-BLAS path; it must answer exactly what FAISS's
single-query scan answers, for every metric, with tombstones and filters."""

from __future__ import annotations

import threading

import faiss
import numpy as np
import pytest

from ragplane.index import Condition, Engine, Filter, FilterOp, IndexType, Metric, Record
from ragplane.index import faiss_index as fx


@pytest.mark.parametrize("metric", list(Metric))
@pytest.mark.parametrize("filtered", [False, True])
def test_batched_equals_single(tmp_path, metric, filtered):
    rng = np.random.default_rng(7)
    with Engine(tmp_path / "d") as e:
        e.create_collection(
            "t", "c", dim=24, metric=metric, index_type=IndexType.FLAT, embedder="x"
        )
        x = rng.standard_normal((2500, 24)).astype(np.float32)
        e.upsert("t", "c", [Record(str(i), x[i], "", {"g": i % 3}) for i in range(2500)])
        e.delete("t", "c", ids=[str(i) for i in range(0, 2500, 7)])  # tombstones
        e.upsert("t", "c", [Record("5", x[6], "", {"g": 2})])  # a replaced id
        flt = Filter(must=(Condition("g", FilterOp.EQ, 2),)) if filtered else None
        q = rng.standard_normal((fx.BLAS_MIN_QUERIES + 5, 24)).astype(np.float32)
        batch = e.search("t", "c", q, 10, filter=flt)
        for i, b in enumerate(batch):
            s = e.search("t", "c", q[i : i + 1], 10, filter=flt)[0]  # FAISS's scan
            assert [h.id for h in b.hits] == [h.id for h in s.hits]
            np.testing.assert_allclose(
                [h.score for h in b.hits], [h.score for h in s.hits], atol=1e-4
            )
            assert b.exhaustive and b.returned_k == 10
            assert not any(int(h.id) % 7 == 0 and h.id != "5" for h in b.hits)


def test_chunking_merges_top_k_across_chunks(monkeypatch, tmp_path):
    monkeypatch.setattr(fx, "_CHUNK_ROWS", 100)
    rng = np.random.default_rng(3)
    with Engine(tmp_path / "d") as e:
        e.create_collection(
            "t", "c", dim=8, metric=Metric.IP, index_type=IndexType.FLAT, embedder="x"
        )
        x = rng.standard_normal((1000, 8)).astype(np.float32)
        e.upsert("t", "c", [Record(str(i), x[i]) for i in range(1000)])
        q = rng.standard_normal((6, 8)).astype(np.float32)
        got = e.search("t", "c", q, 15)
        truth = np.argsort(-(q @ x.T), axis=1)[:, :15]
        for r, t in zip(got, truth, strict=True):
            assert [h.id for h in r.hits] == [str(i) for i in t]


@pytest.mark.parametrize("metric", list(Metric))
def test_fewer_items_than_top_k(tmp_path, metric):
    rng = np.random.default_rng(5)
    with Engine(tmp_path / "d") as e:
        e.create_collection("t", "c", dim=8, metric=metric, index_type=IndexType.FLAT, embedder="x")
        x = rng.standard_normal((3, 8)).astype(np.float32)
        e.upsert("t", "c", [Record(str(i), x[i]) for i in range(3)])
        e.delete("t", "c", ids=["1"])
        got = e.search("t", "c", rng.standard_normal((fx.BLAS_MIN_QUERIES, 8)), 10)
        assert all(sorted(h.id for h in r.hits) == ["0", "2"] for r in got)
        assert all(r.returned_k == 2 and r.exhaustive for r in got)


def test_a_single_query_scans_on_one_openmp_thread_a_few_on_all(tmp_path):
    """FAISS's flat scan of one query uses one thread while the rest of its OpenMP team
    spins, doubling the CPU a search costs: the calling thread asks for one thread then,
    and for the process's default again for a batch (libgomp keeps the count per thread)."""
    if fx._OMP_DEFAULT < 2:
        pytest.skip("OpenMP has one thread here")
    rng = np.random.default_rng(5)
    seen: dict[str, int] = {}
    with Engine(tmp_path / "d") as e:
        e.create_collection("t", "c", dim=8, metric=Metric.L2, index_type=IndexType.FLAT,
                            embedder="x")  # fmt: skip
        x = rng.standard_normal((50, 8)).astype(np.float32)
        e.upsert("t", "c", [Record(str(i), x[i], "", {}) for i in range(50)])

        def searches() -> None:  # a fresh thread starts at the process's default
            seen["before"] = faiss.omp_get_max_threads()
            assert e.search("t", "c", x[:1], 3)[0].hits[0].id == "0"
            seen["one query"] = faiss.omp_get_max_threads()
            assert [r.hits[0].id for r in e.search("t", "c", x[1:3], 3)] == ["1", "2"]
            seen["two queries"] = faiss.omp_get_max_threads()

        worker = threading.Thread(target=searches)
        worker.start()
        worker.join()
    assert seen == {"before": fx._OMP_DEFAULT, "one query": 1,
                    "two queries": fx._OMP_DEFAULT}  # fmt: skip
