"""Search over gRPC against exact numpy search, on vectors of real text embedded by the
canonical model: a flat index returns exactly the brute-force answer (same ids, scores
within 1e-5, ties handled); hnsw recall@10 at default parameters is measured and >= 0.95."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.texts import corpus
from ragplane.v1 import common_pb2, index_pb2, search_pb2

# Embedding 5,000 texts takes ~1 minute on 2 idle cores; allow for a busy machine.
pytestmark = [pytest.mark.parity, pytest.mark.e2e, pytest.mark.timeout(1200)]

N_TEXTS = 5000
N_QUERIES = 100


def shortest(n: int) -> list[str]:
    # The shortest real passages keep embedding 5,000 texts on a 2-core CPU to ~1 minute.
    pool = corpus(9000)
    return sorted(pool, key=lambda t: (len(t), t))[:n]


@pytest.fixture(scope="module")
def served(tmp_path_factory, st_model):
    srv = InProcessServer(
        tmp_path_factory.mktemp("exact") / "d",
        embedder=st_model,
        embedder_name="sentence-transformers",
    )
    texts = shortest(N_TEXTS + N_QUERIES)
    docs, queries = texts[:N_TEXTS], texts[N_TEXTS:]
    s = srv.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="flat"))
    for i in range(0, N_TEXTS, 500):
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection="flat",
                items=[
                    common_pb2.Item(id=str(j), text=docs[j])
                    for j in range(i, min(i + 500, N_TEXTS))
                ],
            )
        )
    got = s.index.Get(
        index_pb2.GetRequest(
            collection="flat", ids=[str(j) for j in range(N_TEXTS)], include_vectors=True
        )
    )
    vectors = np.array([list(it.vector) for it in got.items], dtype=np.float32)
    qv = st_model.embed(queries)
    yield srv, vectors, qv
    srv.stop()


def brute(vectors: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    if metric == "l2":
        return -((vectors - q) ** 2).sum(axis=1)
    if metric == "cosine":
        v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return v @ (q / np.linalg.norm(q))
    return vectors @ q


def assert_same_topk(hits, scores: np.ndarray, k: int) -> None:
    order = np.argsort(-scores, kind="stable")
    kth = scores[order[k - 1]]
    exp = {str(i) for i in order[:k] if scores[i] > kth + 1e-5}  # certain members
    ids = [h.id for h in hits]
    assert len(ids) == k and exp <= set(ids)
    for h in hits:  # every returned score is the true score, and within the true top-k
        assert h.score == pytest.approx(scores[int(h.id)], abs=1e-5)
        assert scores[int(h.id)] >= kth - 1e-5


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_flat_search_equals_numpy_brute_force(served, metric):
    srv, vectors, qv = served
    s = srv.stubs
    name = f"flat_{metric}"
    s.index.CreateCollection(
        index_pb2.CreateCollectionRequest(
            name=name, metric=getattr(index_pb2, f"METRIC_{metric.upper()}")
        )
    )
    for i in range(0, len(vectors), 1000):
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection=name,
                items=[
                    common_pb2.Item(id=str(j), vector=vectors[j].tolist())
                    for j in range(i, min(i + 1000, len(vectors)))
                ],
            )
        )
    for q in qv:
        r = s.search.Search(
            search_pb2.SearchRequest(
                collection=name, vector=common_pb2.Vector(values=q.tolist()), top_k=10
            )
        )
        assert r.exhaustive and r.returned_k == 10
        assert_same_topk(r.hits, brute(vectors, q, metric), 10)


def test_text_search_on_flat_equals_brute_force(served):
    srv, vectors, qv = served
    texts = shortest(N_TEXTS + N_QUERIES)[N_TEXTS:]
    for text, q in zip(texts[:20], qv[:20], strict=True):
        r = srv.stubs.search.Search(
            search_pb2.SearchRequest(collection="flat", text=text, top_k=10)
        )
        assert_same_topk(r.hits, brute(vectors, q, "cosine"), 10)


def test_hnsw_recall_at_10(served):
    srv, vectors, qv = served
    s = srv.stubs
    s.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name="hnsw", index_type=index_pb2.INDEX_TYPE_HNSW)
    )
    for i in range(0, len(vectors), 1000):
        s.index.Upsert(
            index_pb2.UpsertRequest(
                collection="hnsw",
                items=[
                    common_pb2.Item(id=str(j), vector=vectors[j].tolist())
                    for j in range(i, min(i + 1000, len(vectors)))
                ],
            )
        )
    found = 0
    for q in qv:
        r = s.search.Search(
            search_pb2.SearchRequest(
                collection="hnsw", vector=common_pb2.Vector(values=q.tolist()), top_k=10
            )
        )
        truth = {str(i) for i in np.argsort(-brute(vectors, q, "cosine"))[:10]}
        found += len(truth & {h.id for h in r.hits})
    recall = found / (10 * len(qv))
    print(f"\nhnsw recall@10 at defaults over {len(vectors)} real-text vectors: {recall:.4f}")
    assert recall >= 0.95
