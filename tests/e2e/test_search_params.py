"""SearchRequest.params over gRPC: ef_search moves recall on an HNSW collection, exact is
brute force, int8 quantization is a collection setting, and values that do not apply are
INVALID_ARGUMENT with a message that says what does."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ragplane.v1 import admin_pb2, common_pb2, index_pb2, search_pb2

pytestmark = pytest.mark.e2e

DIM = 64  # the fake embedder's


def _vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).standard_normal((40, 16))
    proj = np.random.default_rng(98).standard_normal((16, DIM))
    x = (centres[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, 16))) @ proj
    x += 0.6 * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _create(s, name: str, kind: int, **params) -> np.ndarray:
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(
        name=name, index_type=kind, params=index_pb2.IndexParams(**params)))
    x = _vectors(3000, seed=1)
    for lo in range(0, len(x), 1000):
        s.index.Upsert(index_pb2.UpsertRequest(collection=name, items=[
            common_pb2.Item(id=str(lo + i), vector=v.tolist())
            for i, v in enumerate(x[lo : lo + 1000])]))
    return x


def _search(s, name: str, q: np.ndarray, **params) -> search_pb2.SearchResponse:
    return s.search.Search(search_pb2.SearchRequest(
        collection=name, vector=common_pb2.Vector(values=q.tolist()), top_k=10,
        params=search_pb2.SearchParams(**params)))


def test_ef_search_and_exact_over_grpc(server):
    s = server.stubs
    _create(s, "h", index_pb2.INDEX_TYPE_HNSW, hnsw_m=4, hnsw_ef_construction=16)
    queries = _vectors(100, seed=2)

    def recall(**params) -> float:
        hits = 0
        for q in queries:
            truth = {h.id for h in _search(s, "h", q, exact=True).hits}
            hits += len(truth & {h.id for h in _search(s, "h", q, **params).hits})
        return hits / (10 * len(queries))

    low, high = recall(ef_search=10), recall(ef_search=400)
    assert low + 0.05 < high and high >= 0.98, (low, high)
    r = _search(s, "h", queries[0], exact=True)
    assert r.exhaustive and r.returned_k == 10
    assert not _search(s, "h", queries[0]).exhaustive


def test_int8_collection_over_grpc(server):
    s = server.stubs
    x = _create(s, "q", index_pb2.INDEX_TYPE_HNSW, quantization=index_pb2.QUANTIZATION_INT8)
    info = s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="q"))
    assert info.params.quantization == index_pb2.QUANTIZATION_NONE  # trained at a rebuild
    list(s.admin.Rebuild(admin_pb2.RebuildRequest(collection="q")))
    info = s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="q"))
    assert info.params.quantization == index_pb2.QUANTIZATION_INT8 and info.generation == 2
    r = _search(s, "q", x[5], oversampling=4)
    assert r.hits[0].id == "5" and abs(r.hits[0].score - 1.0) < 1e-5  # rescored: exact score


@pytest.mark.parametrize("name,params,message", [
    ("f", {"ef_search": 64}, "ef_search applies to hnsw collections; collection 'f' is flat"),
    ("h", {"ef_search": -5}, "ef_search must be from 1 to 10000, got -5"),
    ("h", {"nprobe": 8}, "nprobe applies to ivf_pq collections"),
    ("h", {"oversampling": 3}, "oversampling applies to quantized and ivf_pq collections"),
])
def test_bad_params_are_invalid_argument(server, name, params, message):
    s = server.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="f"))
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(
        name="h", index_type=index_pb2.INDEX_TYPE_HNSW))
    with pytest.raises(grpc.RpcError) as e:
        s.search.Search(search_pb2.SearchRequest(
            collection=name, text="anything", top_k=3, params=search_pb2.SearchParams(**params)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in e.value.details()
    with pytest.raises(grpc.RpcError) as e:  # params are for dense search
        s.search.Search(search_pb2.SearchRequest(
            collection="f", text="anything", top_k=3, mode=common_pb2.SEARCH_MODE_LEXICAL,
            params=search_pb2.SearchParams(exact=True)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "apply to dense search" in e.value.details()


def test_params_and_int8_on_a_postgresql_store(pg, tmp_path):
    """On a shared store the rebuild that trains the quantizer is logged and followed: a
    second server serves the int8 generation, rescored, and checks params the same way."""
    from ragplane.testkit.harness import InProcessServer

    url = pg.create_database("search_params")
    a = InProcessServer(tmp_path / "a", store=url)
    b = InProcessServer(tmp_path / "b", store=url)
    try:
        x = _create(a.stubs, "q", index_pb2.INDEX_TYPE_HNSW,
                    quantization=index_pb2.QUANTIZATION_INT8)
        done = list(a.stubs.admin.Rebuild(admin_pb2.RebuildRequest(collection="q")))
        assert done[-1].phase == "swapped"
        token = a.stubs.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name="q")).consistency_token
        info = b.stubs.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name="q", consistency_token=token))
        assert info.params.quantization == index_pb2.QUANTIZATION_INT8 and info.generation == 2
        for s in (a.stubs, b.stubs):
            r = _search(s, "q", x[7], oversampling=2)
            assert r.hits[0].id == "7" and abs(r.hits[0].score - 1.0) < 1e-5
            assert _search(s, "q", x[7], exact=True).exhaustive
            with pytest.raises(grpc.RpcError) as e:
                _search(s, "q", x[7], nprobe=2)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        a.stop()
        b.stop()
