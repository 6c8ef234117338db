"""Admission control, limits and deadlines.

* Overload: many concurrent Embed calls against a slow embedder and a tiny queue are
  answered RESOURCE_EXHAUSTED with a `retry-after` trailer beside the call's `x-request-id`,
  and the process's memory stays bounded while far more data is offered than the bound.
* Limits: texts per request, bytes per text, items per upsert and gRPC message size are
  each refused with a message that names the limit.
* Deadlines: a call whose deadline passes while it waits in the queue ends
  DEADLINE_EXCEEDED and its texts are never embedded.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import psutil
import pytest

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import common_pb2, embed_pb2, index_pb2, search_pb2

pytestmark = pytest.mark.e2e

RSS_BOUND_MB = 96  # peak growth allowed while ~300 MB of requests are offered


class CountingEmbedder(FakeEmbedder):
    """A slow fake that records every text it embedded."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s=delay_s)
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def embed(self, texts, normalize=True):
        with self._lock:
            self.seen.extend(texts)
        return super().embed(texts, normalize)


def _trailer(err: grpc.RpcError, key: str) -> str | None:
    return dict(err.trailing_metadata() or ()).get(key)


def _burst(stub, texts, n):
    """n concurrent Embed calls, each with its own `x-request-id`; returns (ok count,
    [RESOURCE_EXHAUSTED errors], others). Every refusal must carry its caller's request id
    beside `retry-after` (the README's promise: the id comes back in the trailers)."""
    futures = [
        stub.Embed.future(
            embed_pb2.EmbedRequest(texts=texts), timeout=60, metadata=[("x-request-id", f"b{i}")]
        )
        for i in range(n)
    ]
    ok, exhausted, other = 0, [], []
    for i, f in enumerate(futures):
        try:
            r = f.result()
            assert len(r.vectors) == len(texts)
            ok += 1
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert _trailer(e, "x-request-id") == f"b{i}", e.trailing_metadata()
                exhausted.append(e)
            else:
                other.append(e)
    return ok, exhausted, other


def test_overload_gets_resource_exhausted_with_retry_after_and_memory_stays_bounded(
    tmp_path, capsys
):
    srv = InProcessServer(
        tmp_path / "data",
        embedder=FakeEmbedder(delay_s=0.05),
        embed_queue_texts=16,
        workers=32,  # gRPC admits at most workers * 8 = 256 calls at once
    )
    try:
        stub = srv.stubs.embed
        texts = ["x" * 32_000] * 8  # 256 KB per request, one repeated word for the fake
        ok, exhausted, other = _burst(stub, texts, 100)  # warm-up: buffers, threads
        assert not other, other[0]
        proc = psutil.Process()
        base = proc.memory_info().rss
        peak = base
        done = threading.Event()

        def sample():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        rounds, per_round = 12, 100
        totals = [0, 0]
        try:
            for _ in range(rounds):
                ok, exhausted, other = _burst(stub, texts, per_round)
                assert not other, other[0]
                totals[0] += ok
                totals[1] += len(exhausted)
                for e in exhausted:
                    assert "queue is full" in e.details()
                    assert float(_trailer(e, "retry-after")) > 0
                    assert int(_trailer(e, "grpc-retry-pushback-ms")) >= 0
        finally:
            done.set()
            sampler.join()
        growth_mb = (peak - base) / 2**20
        offered_mb = rounds * per_round * len(texts) * len(texts[0]) / 2**20
        with capsys.disabled():
            print(
                f"\noverload: {rounds * per_round} calls ({offered_mb:.0f} MB offered), "
                f"{totals[0]} served, {totals[1]} RESOURCE_EXHAUSTED with retry-after; "
                f"peak RSS growth {growth_mb:.1f} MB (bound {RSS_BOUND_MB} MB)"
            )
        assert totals[1] > rounds * per_round // 2, "the tiny queue should refuse most calls"
        assert totals[0] >= rounds, "some calls should still be served"
        assert growth_mb < RSS_BOUND_MB
        assert srv.runtime.embedding.queued_texts == 0
        # and the server is healthy afterwards
        assert len(stub.Embed(embed_pb2.EmbedRequest(texts=["after"])).vectors) == 1
    finally:
        srv.stop()


def _refused(call, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kw)
    return e.value


def test_request_limits_are_refused_clearly(tmp_path):
    srv = InProcessServer(
        tmp_path / "data", max_batch_texts=4, max_text_bytes=100, max_message_bytes=64 * 1024,
        max_item_text_bytes=16 * 1024,
    )
    try:
        s = srv.stubs
        e = _refused(s.embed.Embed, embed_pb2.EmbedRequest(texts=["a"] * 5))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit is 4" in e.details()
        e = _refused(s.embed.Embed, embed_pb2.EmbedRequest(texts=["é" * 51]))  # 102 bytes
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "102 bytes" in e.details() and "limit is 100" in e.details()
        assert len(s.embed.Embed(embed_pb2.EmbedRequest(texts=["a" * 100] * 4)).vectors) == 4
        stream = s.embed.EmbedStream(
            iter([embed_pb2.EmbedRequest(texts=["ok"]), embed_pb2.EmbedRequest(texts=["a"] * 5)])
        )
        assert len(next(stream).vectors) == 1
        e = _refused(next, stream)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit is 4" in e.details()

        s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c"))
        items = [common_pb2.Item(id=str(i), vector=[0.5] * 64) for i in range(5)]
        e = _refused(s.index.Upsert, index_pb2.UpsertRequest(collection="c", items=items))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit is 4" in e.details()
        # a message over max_message_bytes is refused by gRPC before any work is done
        big = [common_pb2.Item(id="big", vector=[0.5] * 20_000)]  # ~80 KB
        e = _refused(s.index.Upsert, index_pb2.UpsertRequest(collection="c", items=big))
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in e.details()
        e = _refused(
            s.search.Search,
            search_pb2.SearchRequest(
                collection="c", vector=common_pb2.Vector(values=[1.0] * 64), top_k=10_001
            ),
        )
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_k" in e.details()
        # the server is unharmed
        assert s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="c")).count == 0
    finally:
        srv.stop()


def test_truncate_false_refuses_texts_over_max_seq_length(tmp_path):
    srv = InProcessServer(tmp_path / "data", max_seq_length=16, batch_max_tokens=64)
    try:
        long = " ".join(f"w{i}" for i in range(30))
        e = _refused(srv.stubs.embed.Embed, embed_pb2.EmbedRequest(texts=[long], truncate=False))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_seq_length" in e.details()
        r = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=[long]))  # truncate=true
        assert list(r.token_counts) == [16]
    finally:
        srv.stop()


def test_expired_call_ends_deadline_exceeded_and_its_work_is_skipped(tmp_path):
    embedder = CountingEmbedder(delay_s=0.6)
    srv = InProcessServer(tmp_path / "data", embedder=embedder)
    embedder.seen.clear()  # the warm-up's texts, embedded at start
    try:
        stub = srv.stubs.embed
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(stub.Embed, embed_pb2.EmbedRequest(texts=["occupy"]), timeout=10)
            deadline = time.monotonic() + 5
            while "occupy" not in embedder.seen and time.monotonic() < deadline:
                time.sleep(0.01)  # the first pass is now running for 0.6 s
            t0 = time.monotonic()
            e = _refused(stub.Embed, embed_pb2.EmbedRequest(texts=["expired marker"]), timeout=0.2)
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - t0 < 0.5
            assert len(first.result().vectors) == 1
        batcher = srv.runtime.embedding.batcher_for(srv.runtime.embedding.canonical)
        # the next call is served, and the expired one never reached the embedder
        assert len(stub.Embed(embed_pb2.EmbedRequest(texts=["later"])).vectors) == 1
        assert "expired marker" not in embedder.seen
        assert embedder.seen == ["occupy", "later"]
        assert batcher.stats.texts == 2 and batcher.queued_texts == 0
    finally:
        srv.stop()


def test_the_concurrency_cap_refuses_with_retry_after(tmp_path):
    srv = InProcessServer(
        tmp_path / "data",
        embedder=FakeEmbedder(delay_s=0.2),
        workers=2,  # admits workers * 8 = 16 calls at once
    )
    try:
        ok, exhausted, other = _burst(srv.stubs.embed, ["a few words"], 80)
        assert not other, other[0]
        assert ok >= 2 and len(exhausted) >= 40, (ok, len(exhausted))
        for e in exhausted:  # gRPC's own cap would say "Concurrent RPC limit exceeded!"
            assert "limit of 16 concurrent calls" in e.details(), e.details()
            assert float(_trailer(e, "retry-after")) > 0
            assert int(_trailer(e, "grpc-retry-pushback-ms")) > 0
        # nothing stays counted: once the burst is over calls are admitted again (half the
        # cap: a finished call may be uncounted a moment after its answer reached us)
        ok, exhausted, other = _burst(srv.stubs.embed, ["after"], 8)
        assert (ok, exhausted, other) == (8, [], [])
    finally:
        srv.stop()
