"""MemoryService end to end: dedup, recency under an injected clock, TTL, isolation,
paging, durability across restarts (including kill -9)."""

from __future__ import annotations

import grpc
import pytest

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.testkit.harness import InProcessServer, SubprocessServer
from ragplane.v1 import common_pb2, memory_pb2

pytestmark = pytest.mark.e2e


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def remember(stub, ns, text, **kw):
    meta = kw.pop("metadata", None)
    return stub.Remember(
        memory_pb2.RememberRequest(namespace=ns, text=text, metadata=dict_to_struct(meta), **kw)
    )


def recall(stub, ns, query, top_k=5, **kw):
    return stub.Recall(memory_pb2.RecallRequest(namespace=ns, query=query, top_k=top_k, **kw))


def status(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code()


def test_same_fact_said_two_ways_updates_one_memory(tmp_path, st_model):
    srv = InProcessServer(tmp_path / "d", embedder=st_model, embedder_name="sentence-transformers")
    try:
        m = srv.stubs.memory
        a = remember(
            m, "alice", "My favourite colour is blue.", importance=0.3, metadata={"source": "chat"}
        )
        b = remember(m, "alice", "My favorite color is blue.", importance=0.8)
        c = remember(m, "alice", "Alice works as a nurse in Berlin.")
        assert not a.deduplicated and b.deduplicated and b.id == a.id
        assert not c.deduplicated and c.id != a.id
        listed = m.ListMemories(memory_pb2.ListMemoriesRequest(namespace="alice")).memories
        assert len(listed) == 2
        first = next(x for x in listed if x.id == a.id)
        assert first.text == "My favorite color is blue."  # latest phrasing kept
        assert first.importance == pytest.approx(0.8) and first.metadata["source"] == "chat"
        top = recall(m, "alice", "what colour does she like?", top_k=1).memories[0]
        assert top.id == a.id and top.parts.relevance > 0.3
    finally:
        srv.stop()


def test_recency_orders_equally_relevant_memories(tmp_path):
    clock = Clock()
    srv = InProcessServer(tmp_path / "d", clock=clock)
    try:
        m = srv.stubs.memory
        old = remember(m, "ns", "the deploy key rotates weekly", importance=0.5).id
        clock.t += 30 * 86400  # a month later
        new = remember(m, "ns", "the deploy key rotates daily", importance=0.5).id
        got = recall(m, "ns", "the deploy key rotates", top_k=2).memories
        assert [x.id for x in got] == [new, old]
        # the older one is (slightly) more relevant, yet a month of decay ranks it second
        assert got[1].parts.relevance >= got[0].parts.relevance
        assert got[0].parts.recency == pytest.approx(1.0)
        # 30 days at the default 7-day half-life
        assert got[1].parts.recency == pytest.approx(0.5 ** (30 / 7), rel=1e-4)
        for x in got:  # the documented score: weights 1, 0.5, 0.5
            p = x.parts
            assert x.score == pytest.approx(
                (p.relevance + 0.5 * p.recency + 0.5 * p.importance) / 2, abs=1e-6
            )
    finally:
        srv.stop()


def test_ttl_expiry_and_sweeper(tmp_path):
    clock = Clock()
    srv = InProcessServer(tmp_path / "d", clock=clock)
    try:
        m = srv.stubs.memory
        short = remember(m, "ns", "temporary parking spot is B4", ttl_seconds=60).id
        keep = remember(m, "ns", "permanent parking spot is A1").id
        assert {x.id for x in recall(m, "ns", "parking spot").memories} == {short, keep}
        clock.t += 61
        assert [x.id for x in recall(m, "ns", "parking spot").memories] == [keep]
        listed = m.ListMemories(memory_pb2.ListMemoriesRequest(namespace="ns")).memories
        assert [x.id for x in listed] == [keep]
        assert srv.runtime.memory.sweep() == 1
        assert srv.runtime.memory.sweep() == 0
    finally:
        srv.stop()


def test_namespaces_are_isolated_and_forget_is_explicit(server):
    m = server.stubs.memory
    a = remember(m, "alpha", "the launch code is red").id
    remember(m, "beta", "the launch code is blue")
    got = recall(m, "beta", "launch code", top_k=10).memories
    assert a not in {x.id for x in got} and all(x.namespace == "beta" for x in got)
    assert (
        status(lambda: m.Forget(memory_pb2.ForgetRequest(namespace="alpha")))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (
        status(
            lambda: m.Forget(
                memory_pb2.ForgetRequest(namespace="alpha", filter=common_pb2.Filter())
            )
        )
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (
        m.Forget(
            memory_pb2.ForgetRequest(namespace="alpha", ids=common_pb2.IdList(ids=[a]))
        ).forgotten
        == 1
    )
    remember(m, "alpha", "x marks the spot", metadata={"kind": "map"})
    remember(m, "alpha", "y is a letter", metadata={"kind": "alphabet"})
    cond = common_pb2.Condition(field="kind", op=common_pb2.FILTER_OP_EQ, value=py_to_value("map"))
    assert (
        m.Forget(
            memory_pb2.ForgetRequest(namespace="alpha", filter=common_pb2.Filter(must=[cond]))
        ).forgotten
        == 1
    )
    assert m.Forget(memory_pb2.ForgetRequest(namespace="alpha", all=True)).forgotten == 1
    assert status(lambda: recall(m, "alpha", "x")) == grpc.StatusCode.NOT_FOUND
    assert len(recall(m, "beta", "launch code").memories) == 1


def test_paging_is_stable_and_complete(tmp_path):
    clock = Clock()
    srv = InProcessServer(tmp_path / "d", clock=clock)
    try:
        m = srv.stubs.memory
        ids = []
        for i in range(23):
            clock.t += 1
            ids.append(remember(m, "ns", f"fact number {i} about topic {i * 7}").id)
        seen, token, pages = [], "", 0
        while True:
            r = m.ListMemories(
                memory_pb2.ListMemoriesRequest(namespace="ns", page_size=10, page_token=token)
            )
            seen += [x.id for x in r.memories]
            pages += 1
            token = r.next_page_token
            if not token:
                break
        assert pages == 3 and seen == ids
        assert (
            status(
                lambda: m.ListMemories(
                    memory_pb2.ListMemoriesRequest(namespace="ns", page_token="garbage")
                )
            )
            == grpc.StatusCode.INVALID_ARGUMENT
        )
    finally:
        srv.stop()


BAD = [
    ("empty text", dict(namespace="n", text="")),
    ("importance > 1", dict(namespace="n", text="x", importance=1.5)),
    ("importance < 0", dict(namespace="n", text="x", importance=-0.1)),
    ("negative ttl", dict(namespace="n", text="x", ttl_seconds=-5)),
    ("bad namespace", dict(namespace="a/b", text="x")),
    ("empty namespace", dict(namespace="", text="x")),
]


@pytest.mark.parametrize("kw", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_remember_is_invalid_argument(server, kw):
    assert (
        status(lambda: server.stubs.memory.Remember(memory_pb2.RememberRequest(**kw)))
        == grpc.StatusCode.INVALID_ARGUMENT
    )


def test_unknown_namespace_is_not_found(server):
    m = server.stubs.memory
    assert status(lambda: recall(m, "nobody", "x")) == grpc.StatusCode.NOT_FOUND
    assert (
        status(lambda: m.ListMemories(memory_pb2.ListMemoriesRequest(namespace="nobody")))
        == grpc.StatusCode.NOT_FOUND
    )


def test_memories_survive_restart_and_kill_9(tmp_path):
    srv = SubprocessServer(tmp_path / "d")
    srv.start()
    acked = [
        remember(srv.stubs.memory, "ns", f"durable fact {i} {'x' * (i % 5)}").id for i in range(20)
    ]
    srv.kill()
    srv.start()
    listed = srv.stubs.memory.ListMemories(
        memory_pb2.ListMemoriesRequest(namespace="ns", page_size=100)
    ).memories
    assert sorted(x.id for x in listed) == sorted(set(acked))
    assert srv.terminate() == 0
    srv.start()
    assert len(recall(srv.stubs.memory, "ns", "durable fact", top_k=50).memories) == len(set(acked))
    srv.terminate()
