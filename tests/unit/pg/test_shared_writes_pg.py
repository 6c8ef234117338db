"""The PostgreSQL store's upsert (sent to PostgreSQL before its position is known, written
to the cache meanwhile) and the cache's unsynced commits, on a real PostgreSQL: two
servers' engines on one database, the second one not following the log by itself."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

from ragplane.core.errors import InvalidArgument, NotFound
from ragplane.index import writes
from ragplane.index.engine import Engine
from ragplane.index.pg import follower as follower_mod
from ragplane.index.pg.engine import PgEngine
from ragplane.index.pg.follower import STATE_FILE, LogFollower
from ragplane.index.pg.log import PgStore
from ragplane.index.types import IndexType, Metric, Record

T = "t"


def open_engine(path, durable=True):
    return Engine(path, durable=durable)


def server(url, path, follow=True) -> PgEngine:
    """A server's engine; without `follow`, it learns of other writes only by writing."""
    fol = LogFollower(PgStore(url), path, open_engine)
    if follow:
        fol.start()
    else:
        fol.catch_up()
        fol.ready = True
    return PgEngine(fol)


def recs(ids, dim, seed=0):
    rng = np.random.default_rng(seed)
    return [Record(i, rng.standard_normal(dim).astype(np.float32), f"text {i}", {"n": k})
            for k, i in enumerate(ids)]


def create(e: PgEngine, name: str, dim: int) -> None:
    e.create_collection(T, name, dim=dim, metric=Metric.COSINE, index_type=IndexType.FLAT,
                        embedder="e@1")


def state(url) -> tuple[int, int]:
    with psycopg.connect(url) as c:
        head = c.execute("SELECT pos FROM rp_head").fetchone()[0]
        items = c.execute("SELECT count(*) FROM rp_items").fetchone()[0]
    return head, items


@pytest.fixture
def two(db_url, tmp_path):
    a = server(db_url, tmp_path / "a")
    b = server(db_url, tmp_path / "b", follow=False)
    yield a, b
    a.close()
    b.close()


def test_an_upsert_lands_in_postgresql_and_here_at_one_position(two, db_url):
    a, _ = two
    create(a, "docs", 4)
    a.upsert(T, "docs", recs(["x", "y"], 4))
    head, items = state(db_url)
    assert (head, items) == (2, 2) and a.position() == 2
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT DISTINCT pos FROM rp_items").fetchall() == [(2,)]
        (op,) = c.execute("SELECT op FROM rp_changes WHERE pos = 2").fetchone()
    assert op["op"] == "upsert" and op["count"] == 2 and op["dim"] == 4
    assert sorted(r.id for r in a.get(T, "docs", ["x", "y"])) == ["x", "y"]


def test_a_write_after_another_servers_applies_that_first(two, db_url, caplog):
    """b has not seen a's collection, nor its re-creation with another dim: its checks
    against its stale cache fail, the write learns its position, and b catches up and
    checks again before anything commits."""
    a, b = two
    create(a, "docs", 4)
    b.upsert(T, "docs", recs(["b1"], 4))  # unknown here a moment ago: caught up first
    assert b.position() == 2
    a.delete_collection(T, "docs")
    create(a, "docs", 8)
    a.upsert(T, "docs", recs(["a1"], 8))
    b.upsert(T, "docs", recs(["b2"], 8))  # b still thinks dim 4
    assert b.position() == a.follower.store.head() == 6
    assert sorted(r.id for r in b.get(T, "docs", ["a1", "b1", "b2"])) == ["a1", "b2"]
    with psycopg.connect(db_url) as c:
        (op,) = c.execute("SELECT op FROM rp_changes WHERE pos = 6").fetchone()
    assert op["dim"] == 8  # what the collection is at that position, not what b thought
    a.follower.wait_for(6, 5.0)
    assert sorted(r.id for r in a.get(T, "docs", ["a1", "b2"])) == ["a1", "b2"]
    assert a.follower.broken is None and "reloading" not in caplog.text
    a.upsert(T, "docs", recs(["a2"], 8))  # b's check passes on its old state: the guard
    b.upsert(T, "docs", recs(["b3"], 8))  # fails b's COMMIT; b applies a2, sends it again
    assert b.position() == a.follower.store.head() == 8
    assert sorted(r.id for r in b.get(T, "docs", ["a2", "b3"])) == ["a2", "b3"]
    a.upsert(T, "docs", recs(["same"], 8, seed=1))  # new to b, not to PostgreSQL: b's
    mine = recs(["same"], 8, seed=2)  # plain INSERT conflicts, it applies a's, replaces it
    b.upsert(T, "docs", mine)
    a.follower.wait_for(b.position(), 5.0)
    for e in (a, b):
        (got,) = e.get(T, "docs", ["same"], include_vectors=True)
        np.testing.assert_allclose(got.vector, mine[0].vector / np.linalg.norm(mine[0].vector),
                                   rtol=1e-6)


def test_wrong_input_commits_nothing_anywhere(two, db_url):
    a, b = two
    create(a, "docs", 4)
    a.upsert(T, "docs", recs(["x"], 4))
    before = state(db_url)
    with pytest.raises(InvalidArgument, match="dim"):
        a.upsert(T, "docs", recs(["bad"], 5))
    with pytest.raises(InvalidArgument):
        b.upsert(T, "docs", [Record("v", None, "no vector, no chunks", {})])
    with pytest.raises(NotFound):
        a.upsert(T, "nowhere", recs(["x"], 4))
    with pytest.raises(InvalidArgument, match="more than once"):  # PostgreSQL refuses it too
        a.upsert(T, "docs", recs(["d", "d"], 4))
    with pytest.raises(InvalidArgument, match="PostgreSQL refused"):  # only PostgreSQL does
        a.upsert(T, "docs", [Record("n", np.ones(4, np.float32), "a NUL \x00 here", {})])
    assert state(db_url) == before
    assert a.get(T, "docs", ["bad"]) == [] and a.position() == before[0]
    a.upsert(T, "docs", recs(["z"], 4))  # the position given back is the next write's
    assert state(db_url) == (before[0] + 1, before[1] + 1)


def test_the_cache_commits_only_after_postgresql_and_a_failure_after_it_is_acknowledged(
    two, db_url, monkeypatch, caplog
):
    """The cache's write of an upsert brackets PostgreSQL's COMMIT: a failure before the
    COMMIT leaves nothing anywhere; a failure after it is acknowledged (PostgreSQL has the
    rows) and this cache is marked for reloading (b: no thread reloads it meanwhile)."""
    _, b = two
    create(b, "docs", 4)
    before = state(db_url)

    def fails(*args, **kwargs):
        raise OSError("disk gone")

    with monkeypatch.context() as m:
        m.setattr(writes.repo, "replace_items", fails)  # the cache's rows, before COMMIT
        with pytest.raises(OSError, match="disk gone"):
            b.upsert(T, "docs", recs(["x"], 4))
    assert state(db_url) == before and b.position() == before[0]
    with monkeypatch.context() as m:
        m.setattr(writes, "_index", fails)  # FAISS, after both commits
        assert b.upsert(T, "docs", recs(["y"], 4)) == 1
    assert state(db_url) == (before[0] + 1, before[1] + 1) and b.position() == before[0] + 1
    assert "was not applied here: disk gone" in (b.follower.broken or "")
    assert "applying position" in caplog.text


def test_the_cache_does_not_sync_its_commits_but_says_when_it_is_open(db_url, tmp_path):
    e = server(db_url, tmp_path / "a")
    create(e, "docs", 4)
    assert e.local._ctx.writer.execute("PRAGMA synchronous").fetchone()[0] == 0  # OFF
    saved = json.loads((tmp_path / "a" / STATE_FILE).read_text())
    assert saved["open"] is True and saved["boot"] == follower_mod.BOOT
    e.close()
    saved = json.loads((tmp_path / "a" / STATE_FILE).read_text())
    assert saved["open"] is False and saved["pos"] == 1


def test_an_open_cache_of_an_earlier_boot_is_rebuilt_one_of_this_boot_is_kept(
    db_url, tmp_path, caplog
):
    path = tmp_path / "a"
    e = server(db_url, path)
    create(e, "docs", 4)
    e.upsert(T, "docs", recs(["x"], 4))
    e.close()
    saved = json.loads((path / STATE_FILE).read_text())
    (path / STATE_FILE).write_text(json.dumps({**saved, "open": True}))  # a crash, this boot
    caplog.set_level("INFO")
    e = server(db_url, path)
    assert "rebuilding" not in caplog.text and e.get(T, "docs", ["x"])
    e.close()
    (path / STATE_FILE).write_text(json.dumps({**saved, "open": True, "boot": "earlier"}))
    e = server(db_url, path)  # the machine restarted under it: unsynced commits may be lost
    assert "machine restarted" in caplog.text and "loaded from the store" in caplog.text
    assert [r.id for r in e.get(T, "docs", ["x"])] == ["x"]
    e.close()
