"""int8 scalar quantization with exact rescoring: recall falls without the rescoring and
comes back with it, the index takes a quarter of the memory, and the quantizer is trained
at a rebuild (float vectors served until then) and survives a restart."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.index import (
    Engine,
    Filter,
    IndexParams,
    IndexType,
    Metric,
    Quantization,
    Record,
    SearchKnobs,
)
from ragplane.index import search as search_mod
from ragplane.index.types import Condition, FilterOp

from .test_search_knobs import recall_at_10
from .vectors import brute_force, embedding_like, make_records

T = "default"
DIM = 64
N = 5000
QUERIES = embedding_like(300, DIM, seed=7)
INT8 = IndexParams(quantization=Quantization.INT8)


def _index_bytes(eng: Engine, name: str) -> int:
    return faiss.serialize_index(eng._colls[(T, name)].index).size  # white-box: the codes


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """Flat and HNSW collections, float and int8, over the same embedding-like vectors."""
    eng = Engine(tmp_path_factory.mktemp("sq") / "data")
    x = embedding_like(N, DIM, seed=3)
    for name, kind, params in (("flat", IndexType.FLAT, IndexParams()),
                               ("flat8", IndexType.FLAT, INT8),
                               ("hnsw8", IndexType.HNSW, INT8)):
        eng.create_collection(T, name, dim=DIM, metric=Metric.COSINE, index_type=kind,
                              embedder="e@1", params=params)
        eng.upsert(T, name, make_records(x))
        eng.rebuild(T, name)  # trains the quantizer on the collection's vectors
    yield eng, x
    eng.close()


def test_rescoring_restores_the_recall_quantization_loses(quantized):
    eng, x = quantized
    exact = recall_at_10(eng, "flat", x, QUERIES)
    for name in ("flat8", "hnsw8"):
        assert eng.describe(T, name).params.quantization == Quantization.INT8
        raw = recall_at_10(eng, name, x, QUERIES, SearchKnobs(oversampling=1))
        rescored = recall_at_10(eng, name, x, QUERIES)  # default: 3x candidates rescored
        print(f"{name}: exact {exact:.4f} int8 {raw:.4f} rescored {rescored:.4f}")  # noqa: T201
        assert exact == 1.0
        assert raw <= exact - 0.01, (name, raw)  # ~1.5% of the true top 10 lost
        assert rescored >= 0.99 * exact, (name, rescored)
    # rescored scores are the float vectors' own: the flat collection's, exactly
    a = eng.search(T, "flat", QUERIES[:3], 10)
    b = eng.search(T, "flat8", QUERIES[:3], 10)
    for ra, rb in zip(a, b, strict=True):
        assert not rb.exhaustive
        common = {h.id: h.score for h in ra.hits}
        for h in rb.hits:
            if h.id in common:
                assert abs(h.score - common[h.id]) < 1e-5


def test_int8_takes_a_quarter_of_the_memory(quantized):
    eng, _ = quantized
    per_vector = {n: _index_bytes(eng, n) / N for n in ("flat", "flat8", "hnsw8")}
    print("index bytes per vector:", per_vector)  # noqa: T201
    # float32 is 4 bytes a dimension and int8 1; both add the id map (8 bytes + its hash)
    assert per_vector["flat"] >= 4 * DIM and per_vector["flat8"] <= DIM + 40
    assert per_vector["flat8"] < 0.4 * per_vector["flat"]


def test_quantizer_waits_for_data_and_survives_restart(tmp_path):
    data = tmp_path / "d"
    x = embedding_like(1500, DIM, seed=4)
    with Engine(data) as eng:
        eng.create_collection(T, "c", dim=DIM, metric=Metric.COSINE, index_type=IndexType.HNSW,
                              embedder="e@1", params=INT8)
        eng.upsert(T, "c", make_records(x[:500]))
        assert eng.describe(T, "c").params.quantization == Quantization.NONE  # not trained
        notes: list[str] = []
        eng.rebuild(T, "c", progress=lambda p: notes.append(p.message))
        assert any("too few to train int8 quantization" in m for m in notes)
        eng.upsert(T, "c", make_records(x)[500:])
        assert eng.rebuild(T, "c").params.quantization == Quantization.INT8
        before = {(i, h.id) for i, r in enumerate(eng.search(T, "c", QUERIES[:20], 10))
                  for h in r.hits}
    for ckpt in (data / "indexes").rglob("*.faiss"):  # without checkpoints: trained again
        ckpt.unlink()
    with Engine(data) as eng:
        assert eng.describe(T, "c").params.quantization == Quantization.INT8
        after = {(i, h.id) for i, r in enumerate(eng.search(T, "c", QUERIES[:20], 10))
                 for h in r.hits}
        eng.upsert(T, "c", make_records(embedding_like(10, DIM, seed=5), prefix="new"))
        assert eng.describe(T, "c").count == 1510
    # the graph is built in another order (the rebuild adds its held-out rows last)
    assert len(after & before) >= 0.97 * len(before)


def test_quantization_is_for_flat_and_hnsw(engine):
    with pytest.raises(InvalidArgument, match="quantization applies to flat and hnsw"):
        engine.create_collection(T, "c", dim=DIM, metric=Metric.COSINE,
                                 index_type=IndexType.IVF_PQ, embedder="e@1", params=INT8)


def test_a_selective_filter_scores_the_matching_codes_and_reads_few_vectors(
    tmp_path, monkeypatch
):
    # 1% of the items match: every matching code is scored from memory, and only the
    # k x oversampling best are read from the store to rescore (not every match's vector)
    x = embedding_like(N, DIM, seed=8)
    matching = np.arange(3, N, 100)
    with Engine(tmp_path / "d") as eng:
        for name, kind in (("flat8", IndexType.FLAT), ("hnsw8", IndexType.HNSW)):
            eng.create_collection(T, name, dim=DIM, metric=Metric.COSINE, index_type=kind,
                                  embedder="e@1", params=INT8)
            eng.upsert(T, name, make_records(x, metadata=lambda i: {"g": i % 100}))
            eng.rebuild(T, name)
        read: list[int] = []
        vectors_of = search_mod.repo.vectors_of

        def counted(conn, seqs, dim):
            read.append(len(seqs))
            return vectors_of(conn, seqs, dim)

        monkeypatch.setattr(search_mod.repo, "vectors_of", counted)
        flt = Filter(must=(Condition("g", FilterOp.EQ, 3),))
        _, exp_p = brute_force(x[matching], QUERIES[:20], 10, Metric.COSINE)
        for name in ("flat8", "hnsw8"):
            read.clear()
            res = [eng.search(T, name, qi, 10, filter=flt)[0] for qi in QUERIES[:20]]
            assert len(read) == 20 and max(read) <= 10 * 3 < matching.size, (name, read)
            found = sum(len({h.id for h in r.hits} & {f"id{matching[p]}" for p in exp_p[row]})
                        for row, r in enumerate(res))
            assert found >= 0.99 * 20 * 10, (name, found)
            assert all(r.returned_k == 10 and not r.exhaustive for r in res)


def test_a_repeated_filter_reuses_its_decoded_codes_and_sees_each_write(tmp_path):
    x = embedding_like(3000, DIM, seed=12)
    q = QUERIES[0]
    flt = Filter(must=(Condition("g", FilterOp.EQ, 5),))  # 30 of 3,000 items
    with Engine(tmp_path / "d") as eng:
        eng.create_collection(T, "c", dim=DIM, metric=Metric.COSINE, index_type=IndexType.HNSW,
                              embedder="e@1", params=INT8)
        eng.upsert(T, "c", make_records(x, metadata=lambda i: {"g": i % 100}))
        eng.rebuild(T, "c")
        first = eng.search(T, "c", q, 5, filter=flt)[0]
        again = eng.search(T, "c", q, 5, filter=flt)[0]
        assert len(eng._colls[(T, "c")].decoded_cache) == 1  # white-box: decoded once
        assert [h.id for h in again.hits] == [h.id for h in first.hits]
        # a new matching item nearest the query, then it and the best one deleted: the next
        # search sees each write
        eng.upsert(T, "c", [Record(id="new", vector=q, text="", metadata={"g": 5})])
        (res,) = eng.search(T, "c", q, 5, filter=flt)
        assert res.hits[0].id == "new"
        eng.delete(T, "c", ids=["new", first.hits[0].id])
        (res,) = eng.search(T, "c", q, 5, filter=flt)
        ids = [h.id for h in res.hits]
        assert len(ids) == 5 and "new" not in ids and first.hits[0].id not in ids
        assert ids[:4] == [h.id for h in first.hits[1:]]
