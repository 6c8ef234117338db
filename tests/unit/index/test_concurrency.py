"""Many threads writing, deleting and searching at once; then a restart."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ragplane.index import Engine, Filter, IndexType, Metric, Record
from ragplane.index.types import Condition, FilterOp

from .vectors import make_vectors

T = "default"


@pytest.mark.parametrize("kind", [IndexType.FLAT, IndexType.HNSW])
def test_concurrent_writers_readers_then_restart(tmp_path, kind):
    data = tmp_path / "d"
    dim = 8
    eng = Engine(data, checkpoint_every=150)
    eng.create_collection(T, "c", dim=dim, metric=Metric.L2, index_type=kind, embedder="e")
    errors: list[BaseException] = []
    final: dict[str, np.ndarray] = {}
    lock = threading.Lock()

    def writer(w: int):
        try:
            for b in range(15):
                v = make_vectors(10, dim, seed=w * 100 + b)
                # ids overlap across batches of one writer: replacements
                ids = [f"w{w}-{(b * 10 + j) % 60}" for j in range(10)]
                eng.upsert(T, "c", [Record(i, v[j], metadata={"w": w}) for j, i in enumerate(ids)])
                with lock:
                    final.update(zip(ids, v, strict=True))
                if b % 4 == 3:
                    gone = ids[:3]
                    eng.delete(T, "c", ids=gone)
                    with lock:
                        for i in gone:
                            final.pop(i, None)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reader():
        q = make_vectors(3, dim, seed=5)
        try:
            for _ in range(40):
                for r in eng.search(T, "c", q, 5):
                    assert len({h.id for h in r.hits}) == r.returned_k
                eng.search(T, "c", q, 5, filter=Filter(must=(Condition("w", FilterOp.EQ, 1),)))
                eng.describe(T, "c")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors

    def check(e: Engine):
        assert e.describe(T, "c").count == len(final)
        ids = sorted(final)
        recs = e.get(T, "c", ids, include_vectors=True)
        assert [r.id for r in recs] == ids
        for r in recs:
            np.testing.assert_array_equal(r.vector, final[r.id])
        res = e.search(T, "c", np.stack([final[i] for i in ids]), 1)
        found = sum(r.hits[0].id == i for r, i in zip(res, ids, strict=True))
        assert found >= 0.98 * len(ids)

    check(eng)
    eng.close()
    with Engine(data) as eng2:
        check(eng2)
