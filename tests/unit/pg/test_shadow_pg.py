"""The shadow's evidence and flips in the shared store: the same evidence as in SQLite,
no sample lost to servers recording at once, one winner when servers flip at once, and a
flip made on one server served by the others."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import replace

import pytest

from ragplane.core.errors import Unavailable
from ragplane.index.pg.log import PgStore
from ragplane.index.pg.serverdb import PgServerDb
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.shadow import evidence
from ragplane.server.shadow import manager as manager_module
from ragplane.server.shadow.config import PairConfig
from ragplane.server.shadow.evidence import EvidenceKey, EvidenceStore
from ragplane.server.shadow.manager import ShadowManager
from ragplane.testkit.postgres import until
from tests.unit.shadow import LAX


def in_postgres(store: PgStore) -> EvidenceStore:
    """The evidence in a PostgreSQL store's tables, as a server on it opens them."""
    return EvidenceStore(db=PgServerDb(store, evidence.TABLES))

KEY = EvidenceKey("embeddings", "s@2", "c@1", "cpu")
WATCH = dataclasses.replace(KEY, phase="watch")


@pytest.fixture
def pools(pg_store):
    """Two pools on one database: the stores of two servers."""
    other = PgStore(pg_store.url)
    other.migrate()
    yield pg_store, other
    other.close()


def record_some(s: EvidenceStore) -> None:
    s.record_agreement(KEY, "short", [0.99, 0.98])
    s.record_agreement(KEY, "short", [0.97, 1.0, 0.995])
    s.record_agreement(KEY, "medium", [0.9])
    s.record_error(KEY, "medium", "ShadowOutputError: NaN or infinite values in 1 of 2")
    s.record_drop(KEY, "short")
    for i in range(3):
        s.record_timing(KEY, "short", 0.01 * (i + 1), 0.02, 0.03, bool(i % 2))
    s.record_overlap(KEY, 0.7, 5)
    s.record_overlap(KEY, 0.8, 6)  # the latest measurement replaces the last
    s.record_agreement(WATCH, "short", [0.5])
    s.record_agreement(WATCH, "short", [0.6], busy=True)
    s.record_skip(KEY, "short")
    s.record_skip(KEY, "short")
    s.set_serving("embeddings", "s@2", "flip", True, "forced by admin")
    s.set_serving("embeddings", "c@1", "unflip", False, "admin unflip", expect="s@2")


def untimed(s: EvidenceStore) -> tuple:
    def release(r):
        classes = {
            c: dataclasses.replace(row, first_at=0.0, updated_at=0.0, active_s=0.0)
            for c, row in r.classes.items()
        }
        return dataclasses.replace(r, classes=classes)

    return (
        [release(r) for r in s.stored("embeddings", "shadow")],
        [release(r) for r in s.stored("embeddings", "watch")],
        [dataclasses.replace(e, at=0.0) for e in s.history("embeddings")],
        s.state("embeddings"),
    )


def test_the_shared_store_holds_the_same_evidence_as_sqlite(tmp_path, pg_store):
    lite, shared = EvidenceStore(tmp_path / "shadow.db"), in_postgres(pg_store)
    try:
        assert not lite.shared and shared.shared
        for s in (lite, shared):
            record_some(s)
        got = untimed(shared)
        assert got == untimed(lite)
        (rel,) = got[0]
        assert rel.overlap == 0.8 and rel.probes == 6
        assert rel.classes["short"].samples == 5 and rel.classes["short"].cos_min == 0.97
        assert rel.classes["short"].low == [0.97, 0.98, 0.99, 0.995, 1.0]
        assert len(rel.classes["short"].timings) == 3 and rel.classes["medium"].errors == 1
        assert [r.classes["short"].low for r in got[1]] == [[0.5, 0.6]]  # the watch is kept
        assert got[1][0].classes["short"].busy == 1 and rel.classes["short"].skipped == 2
        assert got[3] == ("c@1", False)
    finally:
        lite.close()
        shared.close()


def test_servers_recording_at_once_lose_no_sample(pools):
    stores = [in_postgres(p) for p in pools]
    n, per, batch = 4, 25, [0.99, 0.98, 0.97]

    def worker(i: int) -> None:
        for _ in range(per):
            stores[i % 2].record_agreement(KEY, "short", batch)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    (rel,) = stores[1].stored("embeddings")
    row = rel.classes["short"]
    assert row.batches == n * per and row.samples == n * per * len(batch)
    assert len(row.low) == n * per * len(batch)  # every cosine merged, none overwritten


def test_a_drop_on_the_request_path_does_not_wait_on_postgres(pg_store, monkeypatch):
    """Drops are counted in memory and written with the next write or read; a write that
    fails keeps them counted."""
    s = in_postgres(pg_store)
    real = s._db.write

    def unreachable():
        raise Unavailable("PostgreSQL is unreachable (a test)")

    monkeypatch.setattr(s._db, "write", unreachable)
    for _ in range(3):
        s.record_drop(KEY, "short")  # no PostgreSQL call: nothing raised
    with pytest.raises(Unavailable):
        s.record_agreement(KEY, "short", [0.9])
    monkeypatch.setattr(s._db, "write", real)
    s.record_drop(KEY, "medium")
    (rel,) = s.stored("embeddings")
    assert {c: r.dropped for c, r in rel.classes.items()} == {"short": 3, "medium": 1}
    assert rel.classes["short"].samples == 0  # the failed agreement was not recorded


def race(stores: list[EvidenceStore], serving: str, expect: str, action: str) -> list[bool]:
    """8 threads, on the stores in turn, set `serving` over `expect` at once."""
    n = 8
    barrier = threading.Barrier(n)
    won: list[bool] = []

    def one(i: int) -> None:
        barrier.wait()
        won.append(
            stores[i % 2].set_serving(
                "embeddings", serving, action, False, f"server {i}", expect=expect,
            )
        )  # fmt: skip

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sorted(won)


def test_of_servers_flipping_at_once_exactly_one_wins(pools):
    stores = [in_postgres(p) for p in pools]
    stores[0].record_agreement(WATCH, "short", [0.5])  # an earlier watch: its record stays
    for serving, expect, action in (("s@2", "c@1", "flip"), ("c@1", "s@2", "unflip")):
        assert race(stores, serving, expect, action) == [False] * 7 + [True]
        assert stores[1].serving("embeddings") == serving
    assert [e.action for e in stores[0].history("embeddings")] == ["flip", "unflip"]
    (kept,) = stores[0].stored("embeddings", "watch")  # no flip deletes a release's record
    assert kept.classes["short"].low == [0.5]


def test_the_history_is_in_commit_order_whatever_the_servers_clocks_say(pools, monkeypatch):
    a, b = (in_postgres(p) for p in pools)
    monkeypatch.setattr(evidence.time, "time", lambda: 2000.0)  # A's clock is ahead
    assert a.set_serving("embeddings", "s@2", "flip", True, "forced", expect="c@1")
    monkeypatch.setattr(evidence.time, "time", lambda: 1000.0)
    assert b.set_serving("embeddings", "c@1", "unflip", False, "admin unflip", expect="s@2")
    assert [e.action for e in a.history("embeddings")] == ["flip", "unflip"]
    assert a.state("embeddings") == ("c@1", False)  # the unflip is the last word


def managers(pools, policy: str = "manual"):
    gates = replace(LAX, min_samples=20, min_timed_batches=5, max_time_ratio=1e9)
    cfg = PairConfig(
        "embeddings", "fake", "fake", sample_rate=1.0, timing_rate=1.0, policy=policy,
        gates=gates,
    )  # fmt: skip
    return [
        ShadowManager(
            {"embeddings": cfg},
            FakeEmbedder(),
            {"embeddings": FakeEmbedder(version="2")},
            in_postgres(p),
        )  # fmt: skip
        for p in pools
    ]


def test_a_flip_on_one_server_is_served_by_the_other(pools):
    a, b = managers(pools)
    try:
        assert a.serving("embeddings") == b.serving("embeddings") == "fake@1"
        a.flip("embeddings", force=True)
        assert a.serving("embeddings") == "fake@2"  # at once where it was made
        seconds = until(lambda: b.serving("embeddings") == "fake@2")
        print(f"\nB served A's flip after {seconds * 1e3:.0f} ms")
        assert b.status()[0].history[-1].forced and b.cases["embeddings"].forced
        a.unflip("embeddings")
        seconds = until(lambda: b.serving("embeddings") == "fake@1")
        print(f"B served A's unflip after {seconds * 1e3:.0f} ms")
        assert seconds < manager_module.FOLLOW_S + 5  # the poller runs, not a restart
        b.flip("embeddings", force=True)  # and the other way round
        until(lambda: a.serving("embeddings") == "fake@2")
        assert [h.action for h in a.status()[0].history] == ["flip", "unflip", "flip"]
    finally:
        a.close()
        b.close()


def test_a_server_that_has_not_seen_a_flip_yet_does_not_flip_again(pools, monkeypatch):
    monkeypatch.setattr(manager_module, "FOLLOW_S", 3600.0)  # B never re-reads by itself
    a, b = managers(pools)
    try:
        a.flip("embeddings", force=True)
        assert b.serving("embeddings") == "fake@1"  # B's belief is stale
        b.flip("embeddings", force=True)  # loses the compare-and-set, adopts A's flip
        assert b.serving("embeddings") == "fake@2"
        assert [h.action for h in b.status()[0].history] == ["flip"]
    finally:
        a.close()
        b.close()


def test_the_auto_policy_flips_once_in_the_cluster(pools):
    a, b = managers(pools, policy="auto")
    canonical = FakeEmbedder()
    try:
        for i in range(30):
            for j, m in enumerate((a, b)):
                texts = [f"text {i} {j} {k} about something else" for k in range(4)]
                m.observe("embeddings", texts, canonical.embed(texts, normalize=False), 0.01,
                          "fake@1")  # fmt: skip
            a.drain()
            b.drain()
        until(lambda: a.serving("embeddings") == b.serving("embeddings") == "fake@2")
        assert [h.action for h in a.status()[0].history] == ["flip"]
    finally:
        a.close()
        b.close()
