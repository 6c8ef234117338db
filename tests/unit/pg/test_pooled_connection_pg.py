"""One pooled connection through a run of write conflicts and duplicate keys (issue 38):
another server's writes fail this server's pipelined upserts again and again (its guard,
`rp_expect_head`, and its plain INSERT of ids another server added), more times than
psycopg's prepare threshold; the same connection then serves an upsert, a collection's
creation and a memory. Before, a connection that had seen those pipeline errors answered
`prepared statement "_pg3_N" does not exist` to every later statement."""

from __future__ import annotations

import numpy as np

from ragplane.index.engine import Engine
from ragplane.index.pg.engine import PgEngine
from ragplane.index.pg.follower import LogFollower
from ragplane.index.pg.log import PgStore
from ragplane.index.types import IndexType, Metric, Record
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.embedding.service import EmbeddingService
from ragplane.server.memory import MemoryService

T = "anonymous"
DIM = 64  # the fake embedder's, for the memory namespace


def _engine(url, path, *, follow: bool, pool_size: int = 8) -> PgEngine:
    fol = LogFollower(PgStore(url, max_size=pool_size), path, lambda p, durable=True: Engine(
        p, durable=durable))
    if follow:
        fol.start()
    else:  # it learns of the other server's writes only by writing: every write conflicts
        fol.catch_up()
        fol.ready = True
    return PgEngine(fol)


def _recs(ids, seed):
    rng = np.random.default_rng(seed)
    return [Record(i, rng.standard_normal(DIM).astype(np.float32), f"text {i}", {})
            for i in ids]


def _backend(e: PgEngine) -> int:
    with e.follower.store.conn() as c:
        return c.info.backend_pid


def test_one_connection_serves_every_write_after_more_conflicts_than_the_prepare_threshold(
    db_url, tmp_path
):
    a = _engine(db_url, tmp_path / "a", follow=False, pool_size=1)  # one connection
    b = _engine(db_url, tmp_path / "b", follow=True)
    embedding = EmbeddingService(FakeEmbedder(dim=DIM))
    try:
        a.create_collection(T, "docs", dim=DIM, metric=Metric.COSINE,
                            index_type=IndexType.FLAT, embedder="e@1")
        pid = _backend(a)
        with a.follower.store.conn() as c:
            # no statement is prepared on the server, so none can go missing: today's
            # upsert no longer aborts its pipeline on a conflict, so the rounds below
            # would not catch server-side preparation coming back on their own
            assert c.prepare_threshold is None
        rounds = 3 * 5 + 2  # more than psycopg's default threshold (5) times
        for n in range(rounds):
            b.upsert(T, "docs", _recs([f"b{n}", f"dup{n}"], seed=n))  # b writes first
            # a's cache has neither: its plain INSERT meets b's dup{n} (a duplicate key),
            # and its guard meets b's position (another server wrote first)
            a.upsert(T, "docs", _recs([f"a{n}", f"dup{n}"], seed=1000 + n))
        assert _backend(a) == pid, "the pool replaced the connection: not the same one"
        # the same connection: an upsert, a collection, a memory
        a.upsert(T, "docs", _recs(["after"], seed=7))
        a.create_collection(T, "more", dim=DIM, metric=Metric.COSINE,
                            index_type=IndexType.FLAT, embedder="e@1")
        memory = MemoryService(a, embedding)
        mid, dedup = memory.remember("notes", "the meeting moved to Thursday")
        assert mid and not dedup
        assert _backend(a) == pid
        b.follower.wait_for(a.position(), 5.0)
        assert [r.id for r in b.get(T, "docs", ["after", f"dup{rounds - 1}"])] == [
            "after", f"dup{rounds - 1}"]
        assert {i.name for i in b.list_collections(T)} >= {"docs", "more"}
    finally:
        embedding.close()
        a.close()
        b.close()
