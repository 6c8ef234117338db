"""The servers seen and the leases held, as the console's store page reads them
(`ragplane.index.pg.peers`): from PostgreSQL's views, not from anything a server reports."""

from __future__ import annotations

import time

import psycopg

from ragplane.index.pg import peers
from ragplane.index.pg.log import PgStore


def test_each_server_is_seen_once_and_a_held_lease_names_its_holder(pg_store, db_url):
    # a second server of the cluster: another application_name on the same database
    other = psycopg.connect(db_url, autocommit=True, application_name="ragplane other-host:42")
    with pg_store.conn() as c:
        c.execute(
            "INSERT INTO rp_collections (tenant, kind, name, config) "
            "VALUES ('t', 'collection', 'docs', '{}')"
        )
    try:
        other.execute("SELECT pg_advisory_lock(hashtextextended('rebuild/t/collection/docs', 0))")
        other.execute("SELECT pg_advisory_lock(hashtextextended('someone else''s', 0))")
        with pg_store.lease("once/memory-sweep") as got:
            assert got
            servers, leases = pg_store.peers()
        names = {p.name: p for p in servers}
        assert set(names) == {peers.APP_NAME, "ragplane other-host:42"}
        assert names[peers.APP_NAME].this and not names["ragplane other-host:42"].this
        assert names[peers.APP_NAME].connections >= 1
        held = {x.name: x.holder for x in leases}
        assert held["once/memory-sweep"] == peers.APP_NAME
        assert held["rebuild/t/collection/docs"] == "ragplane other-host:42"
        unknown = [n for n in held if n.startswith("advisory key ")]
        assert len(unknown) == 1 and held[unknown[0]] == "ragplane other-host:42"
        _, after = pg_store.peers()  # the sweep's lease ended with its block
        assert "once/memory-sweep" not in {x.name for x in after}
    finally:
        other.close()
    # a server gone leaves nothing behind, once its backend has exited: PostgreSQL ends it
    # just after the client closes, so the views can show it for a moment
    deadline = time.monotonic() + 10
    while True:
        servers, leases = pg_store.peers()
        gone = [p.name for p in servers] == [peers.APP_NAME] and leases == []
        if gone or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [p.name for p in servers] == [peers.APP_NAME] and leases == []


def test_a_store_names_its_connections_for_the_others(db_url):
    store = PgStore(db_url)
    try:
        with store.conn() as c:
            (name,) = c.execute("SHOW application_name").fetchone()
        assert name == peers.APP_NAME and name.startswith("ragplane ")
    finally:
        store.close()
