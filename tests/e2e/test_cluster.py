"""Three ragplane servers on one PostgreSQL (issue 26): read-your-writes on any server with
the consistency token, the same answers everywhere, kill -9 of the writer under load, and
PostgreSQL stopped and started again under the servers.

The module starts its own PostgreSQL (it stops and starts it) and three `ragplane serve`
processes on it (the fake embedder; client vectors where the test needs many writes)."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragplane.testkit.harness import Stubs
from ragplane.testkit.postgres import available, until
from ragplane.v1 import common_pb2, index_pb2, memory_pb2, search_pb2
from tests.e2e.cluster_load import Load, crash, read_back, servers_on

pytestmark = pytest.mark.skipif(
    not available(),
    reason="PostgreSQL's server binaries are not installed (apt install postgresql)",
)

DIM = 16


@pytest.fixture
def cluster(pg, tmp_path, request):
    with servers_on(pg.create_database("c_" + request.node.name.lower()[:40]), tmp_path, 3) as s:
        yield s


def vec_items(n: int, start: int = 0, seed: int = 0) -> list[common_pb2.Item]:
    rng = np.random.default_rng(seed + start)
    mat = rng.standard_normal((n, DIM)).astype(np.float32)
    return [
        common_pb2.Item(id=f"v{start + i}", text=f"item {start + i}", vector=row)
        for i, row in enumerate(mat.tolist())
    ]


def make_collection(stubs: Stubs, name: str = "c") -> str:
    r = stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name=name, dim=DIM))
    return r.consistency_token


def test_writes_through_one_are_read_at_once_through_the_others_with_the_token(cluster):
    a, b, c = cluster
    make_collection(a.stubs)
    token = a.stubs.index.Upsert(
        index_pb2.UpsertRequest(collection="c", items=vec_items(200))
    ).consistency_token
    assert token
    for other in (b, c):
        got = other.stubs.index.Get(
            index_pb2.GetRequest(collection="c", ids=["v0", "v199"], consistency_token=token)
        )
        assert [i.id for i in got.items] == ["v0", "v199"]
        info = other.stubs.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name="c", consistency_token=token)
        )
        assert info.count == 200
    # text items embedded by the writer, found by lexical search on another server
    t2 = a.stubs.index.Upsert(
        index_pb2.UpsertRequest(
            collection="c",
            items=[common_pb2.Item(id="doc", text="zebra crossing", vector=[1.0] * DIM)],
        )
    ).consistency_token
    hits = c.stubs.search.Search(
        search_pb2.SearchRequest(
            collection="c",
            text="zebra",
            top_k=3,
            consistency_token=t2,
            mode=common_pb2.SEARCH_MODE_LEXICAL,
        )
    ).hits
    assert [h.id for h in hits] == ["doc"]
    # a delete through B is gone on A and C with B's token
    t3 = b.stubs.index.Delete(
        index_pb2.DeleteRequest(collection="c", ids=common_pb2.IdList(ids=["v0"]))
    ).consistency_token
    for other in (a, c):
        got = other.stubs.index.Get(
            index_pb2.GetRequest(collection="c", ids=["v0"], consistency_token=t3)
        )
        assert list(got.items) == []


def test_200_queries_give_identical_ids_on_all_three(cluster):
    a, b, c = cluster
    make_collection(a.stubs)
    token = ""
    for start in range(0, 1000, 250):
        token = a.stubs.index.Upsert(
            index_pb2.UpsertRequest(collection="c", items=vec_items(250, start))
        ).consistency_token
    rng = np.random.default_rng(7)
    queries = rng.standard_normal((200, DIM)).astype(np.float32)
    for q in queries.tolist():
        answers = [
            [
                h.id
                for h in s.stubs.search.Search(
                    search_pb2.SearchRequest(
                        collection="c",
                        vector=common_pb2.Vector(values=q),
                        top_k=10,
                        consistency_token=token,
                    )
                ).hits
            ]
            for s in cluster
        ]
        assert len(answers[0]) == 10
        assert answers[0] == answers[1] == answers[2]


def test_kill_9_of_the_writer_under_load_loses_no_acknowledged_write(cluster):
    a, b, c = cluster
    created = make_collection(a.stubs)
    acked: list[str] = []
    tokens: list[str] = []
    stop = threading.Event()

    def write() -> None:
        start = 0
        while not stop.is_set():
            try:
                r = a.stubs.index.Upsert(
                    index_pb2.UpsertRequest(collection="c", items=vec_items(20, start)),
                    timeout=10,
                )
            except (grpc.RpcError, ValueError):
                # the writer died: what was not acknowledged may or may not be there
                # (`kill` closes this test's channel first: a call after that raises
                # ValueError, "Cannot invoke RPC on closed channel")
                return
            acked.extend(f"v{i}" for i in range(start, start + 20))
            tokens.append(r.consistency_token)
            start += 20

    reads = []

    def read() -> None:
        q = common_pb2.Vector(values=[0.5] * DIM)
        while not stop.is_set():
            req = search_pb2.SearchRequest(
                collection="c", vector=q, top_k=5, consistency_token=created
            )
            reads.append(len(b.stubs.search.Search(req).hits))
            time.sleep(0.01)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(acked) < 400 and time.monotonic() < deadline:
        time.sleep(0.05)
    a.kill()
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert len(acked) >= 400, "the writer was too slow to be killed under load"
    assert reads, "the other servers kept serving searches"
    for other in (b, c):
        got = set()
        for lo in range(0, len(acked), 500):
            got.update(
                i.id
                for i in other.stubs.index.Get(
                    index_pb2.GetRequest(
                        collection="c",
                        ids=acked[lo : lo + 500],
                        consistency_token=tokens[-1],
                    )
                ).items
            )
        assert got == set(acked)


def _call_times(stubs: Stubs) -> tuple[list[grpc.StatusCode], float]:
    codes, worst = [], 0.0
    calls = [
        lambda: stubs.index.ListCollections(index_pb2.ListCollectionsRequest(), timeout=5),
        lambda: stubs.index.Get(index_pb2.GetRequest(collection="c", ids=["v1"]), timeout=5),
        lambda: stubs.index.Upsert(
            index_pb2.UpsertRequest(collection="c", items=vec_items(1, 9000)), timeout=5
        ),
        lambda: stubs.search.Search(
            search_pb2.SearchRequest(
                collection="c", vector=common_pb2.Vector(values=[1.0] * DIM), top_k=3
            ),
            timeout=5,
        ),
    ]
    for call in calls:
        t0 = time.monotonic()
        try:
            call()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
            trailers = dict(exc.trailing_metadata() or ())
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                assert float(trailers["retry-after"]) > 0, exc.details()
        worst = max(worst, time.monotonic() - t0)
    return codes, worst


def test_postgres_stopped_is_unavailable_with_retry_after_then_served_again(pg, cluster):
    a, b, _ = cluster
    make_collection(a.stubs)
    a.stubs.index.Upsert(index_pb2.UpsertRequest(collection="c", items=vec_items(10)))
    health = health_pb2_grpc.HealthStub(b.stubs.channel)
    pg.pg_ctl("stop")
    try:
        time.sleep(1.6)  # past the follower's staleness bound
        for s in (a, b):
            codes, worst = _call_times(s.stubs)
            assert codes == [grpc.StatusCode.UNAVAILABLE] * 4, codes
            assert worst < 1.5, f"a call took {worst:.2f} s to be refused"
        assert health.Check(health_pb2.HealthCheckRequest()).status == (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )
    finally:
        pg.pg_ctl("start")
    deadline = time.monotonic() + 20
    codes: list = []
    while time.monotonic() < deadline:
        codes, _ = _call_times(b.stubs)
        if codes == [grpc.StatusCode.OK] * 4:
            break
        time.sleep(0.5)
    assert codes == [grpc.StatusCode.OK] * 4, codes
    serving = health_pb2.HealthCheckResponse.SERVING
    deadline = time.monotonic() + 5  # the health state follows the follower every 0.25 s
    while health.Check(health_pb2.HealthCheckRequest()).status != serving:
        assert time.monotonic() < deadline, "health did not come back to SERVING"
        time.sleep(0.1)


def test_a_token_from_another_cluster_or_garbage_is_invalid_argument(cluster):
    a = cluster[0]
    make_collection(a.stubs)
    with pytest.raises(grpc.RpcError) as err:
        a.stubs.index.Get(index_pb2.GetRequest(collection="c", ids=["x"], consistency_token="nope"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "consistency_token" in err.value.details()


def test_a_token_not_yet_applied_waits_then_is_unavailable_with_the_lag(cluster):
    a = cluster[0]
    token = make_collection(a.stubs)
    prefix, pos = token.split(".")
    with pytest.raises(grpc.RpcError) as err:
        a.stubs.index.ListCollections(
            index_pb2.ListCollectionsRequest(consistency_token=f"{prefix}.{int(pos) + 1000}"),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "1000 changes behind" in err.value.details()


def test_a_server_back_after_100000_missed_writes_catches_up_before_it_serves(pg, tmp_path):
    from ragplane.testkit.harness import InProcessServer

    url = pg.create_database("catch_up")
    a = InProcessServer(tmp_path / "a", store=url)
    c = InProcessServer(tmp_path / "c", store=url)
    try:
        make_collection(a.stubs)
        c.stop()
        for start in range(0, 100_000, 2000):
            a.stubs.index.Upsert(
                index_pb2.UpsertRequest(collection="c", items=vec_items(2000, start)), timeout=60
            )
        t0 = time.monotonic()
        c.start()  # returns once the server listens: after it has caught up
        took = time.monotonic() - t0
        health = health_pb2_grpc.HealthStub(c.stubs.channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        # no token: what it serves first is already everything it missed
        info = c.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c"))
        assert info.count == 100_000
        print(f"caught up 100,000 missed writes in {took:.1f} s")
    finally:
        a.stop()
        c.stop()


def test_rebuilds_reach_every_server_and_a_reembedding_one_is_embedded_once(pg, tmp_path):
    """An index-type rebuild and a re-embedding one through A: B serves the same generation
    with the same answers; a server that joins later (loaded from the tables) too; the
    re-embedding one cannot be rolled back (PostgreSQL does not keep the old vectors)."""
    from ragplane.testkit.harness import InProcessServer
    from ragplane.v1 import admin_pb2

    url = pg.create_database("rebuilds")
    a = InProcessServer(tmp_path / "a", store=url)
    b = InProcessServer(tmp_path / "b", store=url)
    late = None
    try:
        a.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
        texts = [f"document {i} about {w}" for i, w in enumerate(["cats", "dogs", "birds"] * 40)]
        a.stubs.index.Upsert(
            index_pb2.UpsertRequest(
                collection="docs",
                items=[common_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)],
            )
        )
        done = list(
            a.stubs.admin.Rebuild(
                admin_pb2.RebuildRequest(collection="docs", index_type=index_pb2.INDEX_TYPE_HNSW)
            )
        )
        assert done[-1].phase == "swapped"
        done = list(
            a.stubs.admin.Rebuild(admin_pb2.RebuildRequest(collection="docs", reembed=True))
        )
        assert done[-1].phase == "swapped" and done[-1].generation == 3
        token = a.stubs.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name="docs")
        ).consistency_token
        late = InProcessServer(tmp_path / "late", store=url)
        for q in ["cats", "document 7", "birds about"]:
            answers = [
                [
                    h.id
                    for h in s.stubs.search.Search(
                        search_pb2.SearchRequest(
                            collection="docs", text=q, top_k=5, consistency_token=token
                        )
                    ).hits
                ]
                for s in (a, b, late)
            ]
            assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 5
        info = b.stubs.index.DescribeCollection(
            index_pb2.DescribeCollectionRequest(name="docs", consistency_token=token)
        )
        assert info.generation == 3 and info.index_type == index_pb2.INDEX_TYPE_HNSW
        with pytest.raises(grpc.RpcError) as err:
            a.stubs.admin.Rollback(admin_pb2.RollbackRequest(collection="docs"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "re-embedded" in err.value.details()
    finally:
        for s in (a, b, late):
            if s is not None:
                s.stop()


def test_a_collection_made_a_moment_ago_elsewhere_is_found_without_a_token(pg, tmp_path):
    """B's follower is stopped (as if it lagged): a write and a read on B naming a collection
    made through A catch B up instead of answering NOT_FOUND; a name that exists nowhere
    is still NOT_FOUND."""
    from ragplane.testkit.harness import InProcessServer

    url = pg.create_database("lagging")
    a = InProcessServer(tmp_path / "a", store=url)
    b = InProcessServer(tmp_path / "b", store=url)
    try:
        follower = b.runtime.backend.follower
        follower._stop.set()
        follower._thread.join(timeout=10)
        follower.last_contact = float("inf")  # healthy as far as the check goes
        a.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="fresh", dim=DIM))
        got = b.stubs.index.Get(index_pb2.GetRequest(collection="fresh", ids=["v2"]))
        assert list(got.items) == []
        a.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="texts"))
        b.stubs.index.Upsert(
            index_pb2.UpsertRequest(
                collection="texts", items=[common_pb2.Item(id="t", text="made elsewhere")]
            )
        )
        got = b.stubs.index.Get(index_pb2.GetRequest(collection="texts", ids=["t"]))
        assert [i.text for i in got.items] == ["made elsewhere"]
        with pytest.raises(grpc.RpcError) as err:
            b.stubs.index.Get(index_pb2.GetRequest(collection="nowhere", ids=["v2"]))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        a.stop()
        b.stop()


def test_lexical_and_hybrid_rankings_equal_the_embedded_stores(pg, tmp_path):
    """The same items written to an embedded server and to a PostgreSQL-store server: the
    same ids and scores for lexical and hybrid search (BM25 over the same rows)."""
    from ragplane.testkit.harness import InProcessServer
    from ragplane.testkit.texts import corpus

    texts = corpus(300)
    lite = InProcessServer(tmp_path / "lite", store="sqlite")
    shared = InProcessServer(tmp_path / "pg", store=pg.create_database("bm25"))
    try:
        for s in (lite, shared):
            s.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="t"))
            for lo in range(0, len(texts), 100):
                s.stubs.index.Upsert(
                    index_pb2.UpsertRequest(
                        collection="t",
                        items=[
                            common_pb2.Item(id=f"d{i}", text=texts[i]) for i in range(lo, lo + 100)
                        ],
                    )
                )
            s.stubs.index.Delete(
                index_pb2.DeleteRequest(collection="t", ids=common_pb2.IdList(ids=["d3", "d40"]))
            )
        queries = [" ".join(t.split()[2:5]) for t in texts[::37]]
        for mode in (common_pb2.SEARCH_MODE_LEXICAL, common_pb2.SEARCH_MODE_HYBRID):
            for q in queries:
                req = search_pb2.SearchRequest(collection="t", text=q, top_k=10, mode=mode)
                a = lite.stubs.search.Search(req).hits
                b = shared.stubs.search.Search(req).hits
                assert [h.id for h in a] == [h.id for h in b], (mode, q)
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)
                assert len(a) > 0
    finally:
        lite.stop()
        shared.stop()


SUSTAINED_S = 60.0


def test_contention_a_kill_9_and_a_crash_of_postgresql_answer_ok_or_unavailable(pg, cluster):
    """Issue 38. Three servers write the same ids and their own, create collections and
    remember for a minute; one is killed -9 while the others go on; PostgreSQL is
    stopped -m immediate and started again. Every call answers OK, or UNAVAILABLE with
    retry-after within 1 s, never INTERNAL; every acknowledged write is then read back
    on every server (the killed one restarted)."""
    a, b, c = cluster
    make_collection(a.stubs)
    first = a.stubs.memory.Remember(memory_pb2.RememberRequest(namespace="memories", text="a"))
    load = Load({"a": a.stubs, "b": b.stubs, "c": c.stubs})
    load.acked.memories.add(first.id)
    load.start()
    time.sleep(SUSTAINED_S)
    killed = time.monotonic()
    load.stop("a")
    a.kill()
    time.sleep(5)
    down = time.monotonic()
    crash(pg)
    time.sleep(3)
    pg.pg_ctl("start")
    back = time.monotonic()
    until(lambda: load.codes(since=time.monotonic() - 1).get(("Upsert", "OK"), 0) > 0, 60)
    time.sleep(3)
    load.stop()
    calls = [x for x in load.calls if not (x.server == "a" and x.at >= killed)]
    summary = {
        phase: load.codes(since)
        for phase, since in (("all", 0.0), ("after kill", killed), ("after crash", down))
    }
    print(summary, f"PostgreSQL back after {back - down:.1f} s")
    failed = [x for x in calls if x.code != grpc.StatusCode.OK]
    print("failed calls: worst", max((x.seconds for x in failed), default=0.0), "s;",
          "ok calls: worst", max(x.seconds for x in calls if x.code == grpc.StatusCode.OK))
    wrong = [x for x in failed if x.code != grpc.StatusCode.UNAVAILABLE]
    assert not wrong, (summary, wrong[:5])
    assert all(x.retry_after and x.retry_after > 0 for x in failed), [
        x for x in failed if not x.retry_after][:5]
    slow = [x for x in failed if x.seconds > 1.0]
    assert not slow, slow[:5]
    assert summary["after crash"][("Upsert", "UNAVAILABLE")] > 0, "the crash was not seen"
    assert len(load.acked.items) > 100 and len(load.acked.memories) > 5
    a.start()
    for s in (a, b, c):
        read_back(s.stubs, load)
