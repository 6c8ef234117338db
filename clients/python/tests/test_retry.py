"""Retries: RESOURCE_EXHAUSTED and UNAVAILABLE are retried a bounded number of times,
waiting the server's `retry-after` when it sends one; round-robin over several targets,
failing over from a dead one; deadlines. Fake servers script the refusals; the last test
overloads a real server."""

from __future__ import annotations

import asyncio
import socket
import threading

import grpc
import pytest

from ragplane_client import NO_RETRY, AsyncClient, Client, RetryPolicy

from fakes import FakeServer, Script

BUSY = grpc.StatusCode.RESOURCE_EXHAUSTED
DOWN = grpc.StatusCode.UNAVAILABLE
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.02)


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def make(*failures, delay=0.0, name="fake"):
        srv = FakeServer(Script(failures, delay), name)
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.stop()


def test_retry_after_is_honoured(fake):
    srv = fake((BUSY, 0.3), (BUSY, 0.2))
    with Client(srv.target, retry=FAST) as c:
        r = c.upsert("c", [{"id": "1", "text": "t"}])
    assert r.upserted == 1 and len(srv.script.times) == 3
    first, second = srv.script.gaps()
    assert 0.3 <= first < 1.0 and 0.2 <= second < 1.0  # not FAST's 10-20 ms backoff


def test_without_retry_after_the_backoff_is_used_and_attempts_are_bounded(fake):
    srv = fake(*[(DOWN, None)] * 10)
    with Client(srv.target, retry=FAST) as c, pytest.raises(grpc.RpcError) as e:
        c.embedder_info()
    assert e.value.code() == DOWN and len(srv.script.times) == 4  # max_attempts
    assert all(g < 0.2 for g in srv.script.gaps())
    with Client(srv.target, retry=NO_RETRY) as c, pytest.raises(grpc.RpcError):
        c.embedder_info()
    assert len(srv.script.times) == 5


def test_unavailable_is_not_retried_for_calls_with_side_effects(fake):
    srv = fake((DOWN, None), (BUSY, 0.05))
    with Client(srv.target, retry=FAST) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.create_collection("x")  # not idempotent: it may have been created
        assert e.value.code() == DOWN and len(srv.script.times) == 1
        assert c.create_collection("x").name == "x"  # overload is refused before acting
    assert len(srv.script.times) == 3


def test_other_codes_and_deadlines_are_not_retried(fake):
    srv = fake((grpc.StatusCode.INVALID_ARGUMENT, None))
    with Client(srv.target, retry=FAST) as c, pytest.raises(grpc.RpcError) as e:
        c.embedder_info()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(srv.script.times) == 1
    slow = fake(delay=0.5)
    with Client(slow.target, retry=FAST, timeout=0.1) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.embedder_info()
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert c.embedder_info(timeout=5).dim == 3  # the call's own timeout wins
    assert len(slow.script.times) == 2


def test_round_robin_over_targets_and_failover_from_a_dead_one(fake):
    a, b = fake(name="a"), fake(name="b")
    with Client([a.target, b.target]) as c:
        models = [c.embedder_info().model for _ in range(6)]
    assert models == ["a", "b"] * 3
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with Client([dead, a.target], retry=FAST) as c:
        assert [c.embedder_info().model for _ in range(4)] == ["a"] * 4


def test_async_retry_after_round_robin_and_bounds(fake):
    busy = fake((BUSY, 0.3), name="busy")
    other = fake(name="other")

    async def go():
        async with AsyncClient(busy.target, retry=FAST) as c:
            assert (await c.upsert("c", [{"id": "1"}])).upserted == 1
        async with AsyncClient([busy.target, other.target]) as c:
            return [(await c.embedder_info()).model for _ in range(4)]

    assert asyncio.run(go()) == ["busy", "other"] * 2
    assert 0.3 <= busy.script.gaps()[0] < 1.0
    down = fake(*[(DOWN, None)] * 10)

    async def fails():
        async with AsyncClient(down.target, retry=FAST) as c:
            await c.embedder_info()

    with pytest.raises(grpc.RpcError) as e:
        asyncio.run(fails())
    assert e.value.code() == DOWN and len(down.script.times) == 4


def test_a_real_server_at_its_limit_is_waited_out(tmp_path):
    """A slow embedder and a queue of 4 texts: raw concurrent calls are refused with
    retry-after, the client's calls all succeed."""
    from ragplane.server.embedding.fake import FakeEmbedder
    from ragplane.testkit.harness import InProcessServer

    srv = InProcessServer(
        tmp_path / "data", embedder=FakeEmbedder(delay_s=0.05), embed_queue_texts=4
    )
    try:
        target = f"127.0.0.1:{srv.port}"
        results, errors = [], []
        policy = RetryPolicy(max_attempts=50, max_retry_after=0.2)
        with Client(target, retry=policy) as c:

            def call(i: int) -> None:
                try:
                    results.append(c.embed([f"text {i} a", f"text {i} b"]).dim)
                except grpc.RpcError as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            with Client(target, retry=NO_RETRY) as raw:
                refused = _refusals(raw, 12)
        assert errors == [] and results == [64] * 12
        assert refused, "the server should have refused some raw calls"
        assert all(float(dict(e.trailing_metadata())["retry-after"]) > 0 for e in refused)
    finally:
        srv.stop()


def _refusals(c: Client, n: int) -> list[grpc.RpcError]:
    out: list[grpc.RpcError] = []

    def call(i: int) -> None:
        try:
            c.embed([f"raw {i} a", f"raw {i} b"])
        except grpc.RpcError as exc:
            assert exc.code() == BUSY, exc
            out.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
