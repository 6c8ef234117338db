"""The shared store's schema: a version-1 database upgrades in place to the newest version
with its data kept, and servers that migrate at once do not race."""

from __future__ import annotations

import threading

import psycopg
import pytest

from ragplane.index.pg import schema

V2_TABLES = {
    "rp_keys", "rp_shadow_evidence", "rp_shadow_timings", "rp_shadow_overlap",
    "rp_shadow_state", "rp_shadow_history",
}  # fmt: skip


def tables(c: psycopg.Connection) -> set[str]:
    rows = c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
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


def test_the_newest_version_is_4_with_the_servers_state_tables_and_the_head_guard():
    assert schema.VERSION == 4 == max(schema.UPGRADES)


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
