"""The shared store's schema: a version-1 database upgrades in place to the newest version
with its data kept, and servers that migrate at once do not race."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg.types.json import Jsonb

from ragplane.index.pg import schema

V2_TABLES = {
    "rp_keys", "rp_shadow_evidence", "rp_shadow_timings", "rp_shadow_overlap",
    "rp_shadow_state", "rp_shadow_history",
}  # fmt: skip


def tables(c: psycopg.Connection) -> set[str]:
    rows = c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def columns(c: psycopg.Connection, table: str) -> set[str]:
    rows = c.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,)
    ).fetchall()
    return {r[0] for r in rows}


def make_v1(url: str) -> str:
    """A version-1 store holding a collection, an item and its change."""
    with psycopg.connect(url, autocommit=True) as c:
        store_id = schema.migrate(c, {1: schema.UPGRADES[1]})
        assert schema.current_version(c) == 1 and not V2_TABLES & tables(c)
        c.execute("UPDATE rp_head SET pos = 1")
        c.execute('INSERT INTO rp_changes (pos, op) VALUES (1, \'{"op": "create"}\')')
        c.execute("INSERT INTO rp_collections VALUES ('t', 'collection', 'docs', '{\"dim\": 4}')")
        c.execute("INSERT INTO rp_items VALUES ('t', 'collection', 'docs', 'a', 1, '{}', '\\x01')")
    return store_id


def test_the_newest_version_is_5_without_the_logs_vectors_column():
    assert schema.VERSION == 5 == max(schema.UPGRADES)


def test_a_version_1_database_upgrades_in_place_keeping_its_data(db_url):
    store_id = make_v1(db_url)
    with psycopg.connect(db_url, autocommit=True) as c:
        assert schema.migrate(c) == store_id  # the same store, not a new one
        assert schema.current_version(c) == schema.VERSION
        assert V2_TABLES <= tables(c)
        assert c.execute("SELECT pos FROM rp_head").fetchone()[0] == 1
        assert c.execute("SELECT pos, op FROM rp_changes").fetchall() == [(1, {"op": "create"})]
        assert c.execute("SELECT tenant, name, config FROM rp_collections").fetchall() == [
            ("t", "docs", {"dim": 4})
        ]
        assert c.execute("SELECT id, pos, vectors FROM rp_items").fetchall() == [("a", 1, b"\x01")]
        shadow = {r[0] for r in c.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'rp_shadow_evidence'"
        ).fetchall()}
        assert {"skipped", "busy", "active_s"} <= shadow  # version 4
        assert "vectors" not in columns(c, "rp_changes")  # version 5
        assert schema.migrate(c) == store_id  # again: nothing to do
        assert schema.current_version(c) == schema.VERSION
        c.execute("SELECT rp_expect_head(1)")  # the head is 1: passes
        with pytest.raises(psycopg.errors.SerializationFailure, match="before position 2"):
            c.execute("SELECT rp_expect_head(2)")


@pytest.mark.parametrize("start", ["empty", "version 1"])
def test_servers_migrating_at_once_do_not_race(db_url, start):
    before = make_v1(db_url) if start == "version 1" else None
    n = 8
    barrier = threading.Barrier(n)
    ids: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as c:
                barrier.wait()
                ids.append(schema.migrate(c))
        except BaseException as exc:  # noqa: BLE001 - every failure is the test's finding
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(ids) == n and len(set(ids)) == 1
    assert before is None or ids[0] == before
    with psycopg.connect(db_url, autocommit=True) as c:
        assert schema.current_version(c) == schema.VERSION
        assert c.execute("SELECT count(*) FROM rp_meta").fetchone()[0] == 1


def test_a_version_4_log_upgrades_and_its_changes_stay_readable(db_url, tmp_path):
    """A store at the previous version, its log written as servers of that version wrote
    it (every operation, an upsert's `vectors` NULL): after the upgrade the column is gone
    and every change decodes to its operation and applies to a fresh cache."""
    from ragplane.index.engine import Engine
    from ragplane.index.pg import changes, codec
    from ragplane.index.pg.log import PgStore
    from ragplane.index.types import Chunking, IndexParams, IndexType, Kind, Metric

    before = {v: sql for v, sql in schema.UPGRADES.items() if v <= 4}
    config = {"dim": 2, "metric": "cosine", "index_type": "flat", "embedder": "e@1",
              "params": codec.params_to_json(IndexParams()), "lexical_index": True,
              "chunking": codec.chunking_to_json(Chunking())}
    logged = [
        {"op": "create", "tenant": "t", "name": "docs", "kind": "collection", **config},
        {"op": "upsert", "tenant": "t", "name": "docs", "kind": "collection", "dim": 2,
         "count": 2},
        {"op": "delete", "tenant": "t", "name": "docs", "ids": ["b"], "kind": "collection"},
        {"op": "embedder", "tenant": "t", "name": "docs", "embedder": "e@2",
         "kind": "collection"},
        {"op": "rebuild", "tenant": "t", "name": "docs", "min_recall": 0.0,
         "index_type": "flat", "params": config["params"], "kind": "collection"},
        {"op": "rollback", "tenant": "t", "name": "docs", "kind": "collection"},
    ]
    vec = b"\x00\x00\x80\x3f\x00\x00\x00\x00"  # [1, 0] as little-endian float32
    with psycopg.connect(db_url, autocommit=True) as c:
        store_id = schema.migrate(c, before)
        assert schema.current_version(c) == 4 and "vectors" in columns(c, "rp_changes")
        for pos, op in enumerate(logged, 1):
            c.execute("INSERT INTO rp_changes (pos, op, vectors) VALUES (%s, %s, NULL)",
                      (pos, Jsonb(op)))
        c.execute("UPDATE rp_head SET pos = %s", (len(logged),))
        for item in ("a", "b"):
            c.execute("INSERT INTO rp_items VALUES ('t', 'collection', 'docs', %s, 2, %s, %s)",
                      (item, Jsonb({"id": item, "text": item,
                                                       "metadata": {}}), vec))
    store = PgStore(db_url)
    try:
        assert store.migrate() == store_id
        with store.conn() as c:
            assert schema.current_version(c) == 5 and "vectors" not in columns(c, "rp_changes")
        got = store.changes_after(0)
        assert [ch.pos for ch in got] == [1, 2, 3, 4, 5, 6]
        assert [ch.op.encode()["op"] for ch in got] == [op["op"] for op in logged]
        create, upsert, delete = got[0].op, got[1].op, got[2].op
        assert isinstance(create, changes.Create) and create.kind is Kind.COLLECTION
        assert create.config.dim == 2 and create.config.metric is Metric.COSINE
        assert isinstance(upsert, changes.Upsert) and (upsert.dim, upsert.count) == (2, 2)
        assert isinstance(delete, changes.Delete) and delete.ids == ("b",)
        assert isinstance(got[4].op, changes.Rebuild) and got[4].op.index_type is IndexType.FLAT
        for ch in got:  # each encodes to what decodes to itself
            assert changes.decode(ch.op.encode()) == ch.op
        with Engine(tmp_path / "cache") as cache:
            for ch in got:
                ch.op.apply(cache, store, ch.pos)
            info = cache.describe("t", "docs")
            assert info.count == 1 and info.embedder == "e@2"
            assert [r.id for r in cache.get("t", "docs", ["a", "b"])] == ["a"]
        with pytest.raises(ValueError, match="unknown operation 'merge'"):
            changes.decode({"op": "merge", "tenant": "t", "kind": "collection", "name": "x"})
    finally:
        store.close()
