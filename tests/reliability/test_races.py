"""Concurrent chaos: valid requests that race each other on the same two collection names
(create, delete, upsert, delete by filter, get, search, describe, list, compact, rebuild,
remember, recall, forget) from several threads. Losing a race is fine — NOT_FOUND,
ALREADY_EXISTS, FAILED_PRECONDITION — but never INTERNAL or UNKNOWN, and the server keeps
serving. Seeded; about 4,800 calls.
"""

from __future__ import annotations

import collections
import random
import threading

import grpc
import pytest

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import admin_pb2, common_pb2, index_pb2, memory_pb2, search_pb2

pytestmark = pytest.mark.e2e

THREADS, OPS = 8, 600
NAMES = ["r1", "r2"]
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def _ops(s, rng: random.Random):
    name = rng.choice(NAMES)
    vec = [rng.uniform(-1, 1) for _ in range(64)]
    flt = common_pb2.Filter(
        must=[
            common_pb2.Condition(
                field="g", op=common_pb2.FILTER_OP_EQ, value=py_to_value(rng.randint(0, 3))
            )
        ]
    )
    return {
        "create": lambda: s.index.CreateCollection(
            index_pb2.CreateCollectionRequest(
                name=name,
                index_type=rng.choice([index_pb2.INDEX_TYPE_FLAT, index_pb2.INDEX_TYPE_HNSW]),
            )
        ),
        "drop": lambda: s.index.DeleteCollection(index_pb2.DeleteCollectionRequest(name=name)),
        "upsert": lambda: s.index.Upsert(
            index_pb2.UpsertRequest(
                collection=name,
                items=[
                    common_pb2.Item(
                        id=f"i{rng.randint(0, 60)}-{k}",
                        vector=vec,
                        text=f"text {k}",
                        metadata=dict_to_struct({"g": rng.randint(0, 3)}),
                    )
                    for k in range(rng.randint(1, 20))
                ],
            )
        ),
        "upsert_text": lambda: s.index.Upsert(
            index_pb2.UpsertRequest(
                collection=name, items=[common_pb2.Item(id=f"t{rng.randint(0, 9)}", text="a b c")]
            )
        ),
        "delete": lambda: s.index.Delete(index_pb2.DeleteRequest(collection=name, filter=flt)),
        "get": lambda: s.index.Get(
            index_pb2.GetRequest(collection=name, ids=["i1-0", "i2-0"], include_vectors=True)
        ),
        "search": lambda: s.search.Search(
            search_pb2.SearchRequest(
                collection=name,
                vector=common_pb2.Vector(values=vec),
                top_k=rng.randint(1, 50),
                filter=flt if rng.random() < 0.5 else None,
                include_text=True,
                include_metadata=True,
            )
        ),
        "search_text": lambda: s.search.Search(
            search_pb2.SearchRequest(collection=name, text="text 1", top_k=5)
        ),
        "describe": lambda: s.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name=name)
        ),
        "list": lambda: s.index.ListCollections(index_pb2.ListCollectionsRequest()),
        "compact": lambda: s.admin.Compact(admin_pb2.CompactRequest(collection=name)),
        "rebuild": lambda: list(
            s.admin.Rebuild(
                admin_pb2.RebuildRequest(
                    collection=name, index_type=index_pb2.INDEX_TYPE_HNSW, min_recall=0.5
                )
            )
        ),
        "remember": lambda: s.memory.Remember(
            memory_pb2.RememberRequest(namespace=name, text=f"fact {rng.randint(0, 30)}")
        ),
        "recall": lambda: s.memory.Recall(
            memory_pb2.RecallRequest(namespace=name, query="fact 3", top_k=3)
        ),
        "forget": lambda: s.memory.Forget(memory_pb2.ForgetRequest(namespace=name, all=True)),
    }


WEIGHTS = {
    "create": 4, "drop": 2, "upsert": 8, "upsert_text": 3, "delete": 3, "get": 4, "search": 8,
    "search_text": 3, "describe": 2, "list": 1, "compact": 1, "rebuild": 1, "remember": 3,
    "recall": 2, "forget": 1,
}  # fmt: skip


def test_racing_valid_requests_never_answer_internal(tmp_path, capsys):
    srv = InProcessServer(tmp_path / "data")
    outcomes: collections.Counter = collections.Counter()
    failures: list[str] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        kinds = list(WEIGHTS)
        for _ in range(OPS):
            kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
            try:
                _ops(srv.stubs, rng)[kind]()
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
                if code in BAD:
                    with lock:
                        failures.append(f"{kind}: {code.name} {e.details()}")
            with lock:
                outcomes[(kind, code.name)] += 1

    try:
        threads = [threading.Thread(target=worker, args=(1000 + t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads), "a call hung"
        with capsys.disabled():
            total = sum(outcomes.values())
            codes = collections.Counter()
            for (_, c), n in outcomes.items():
                codes[c] += n
            print(f"\nraces: {total} calls, {dict(codes)}")
        assert not failures, "\n".join(failures[:20])
        # still serving, and consistent: what Describe counts, Search can find
        for name in NAMES:
            try:
                info = srv.stubs.index.DescribeCollection(
                    index_pb2.DescribeCollectionRequest(name=name)
                )
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
                continue
            r = srv.stubs.search.Search(
                search_pb2.SearchRequest(
                    collection=name, vector=common_pb2.Vector(values=[0.5] * 64), top_k=10_000
                )
            )
            assert len(r.hits) == info.count
    finally:
        srv.stop()
