"""API keys in the shared store: two KeyStores on two pools over one database stand for
two servers. A key made on one authenticates on the other; a revoked one is refused by the
other within MAX_STALE_S; PostgreSQL unreachable is Unavailable, never a guess."""

from __future__ import annotations

import time

import psycopg
import pytest

from ragplane.core.errors import Unauthenticated, Unavailable
from ragplane.index.pg.log import PgStore
from ragplane.index.pg.serverdb import PgServerDb
from ragplane.server import auth
from ragplane.server.auth import KeyStore
from ragplane.testkit.postgres import until


def in_postgres(store: PgStore) -> KeyStore:
    """The keys in a PostgreSQL store's tables, as a server on it opens them."""
    return KeyStore(db=PgServerDb(store, auth.TABLES))

EMBED = "/ragplane.v1.EmbedService/Embed"


@pytest.fixture
def two(pg_store):
    """KeyStores of server A and server B on one database, each with its own pool."""
    other = PgStore(pg_store.url)
    other.migrate()
    a, b = in_postgres(pg_store), in_postgres(other)
    yield a, b
    a.close()
    b.close()
    other.close()


def accepts(store: KeyStore, secret: str) -> bool:
    """The key authenticates (not merely: authentication is off)."""
    try:
        return store.check(EMBED, f"Bearer {secret}") is not auth.ANONYMOUS
    except Unauthenticated:
        return False


def test_a_key_made_on_one_server_authenticates_on_the_other(two):
    a, b = two
    assert not b.enabled and b.check(EMBED, "") == auth.ANONYMOUS  # no keys: auth off
    info, secret = a.create("t1", ["read"], "made on A")
    assert a.check(EMBED, f"Bearer {secret}").tenant == "t1"  # at once on its own server
    seconds = until(lambda: accepts(b, secret))
    print(f"\nB accepted A's new key after {seconds * 1e3:.0f} ms")
    assert b.check(EMBED, f"Bearer {secret}") == auth.Principal(
        "t1", frozenset({"read"}), info.key_id
    )
    assert b.enabled  # and auth is on there too: no key is no longer anonymous
    with pytest.raises(Unauthenticated):
        b.check(EMBED, "")
    assert [k.key_id for k in b.list()] == [info.key_id]


def test_a_key_revoked_on_one_server_is_refused_by_the_other_within_the_bound(two):
    a, b = two
    a.create("t1", ["read"])  # another key: auth stays on after the revocation
    info, secret = a.create("t1", ["read"])
    until(lambda: accepts(b, secret))
    a.revoke(info.key_id)
    revoked_at = time.monotonic()
    assert not accepts(a, secret)  # at once where it was revoked
    seconds = until(lambda: not accepts(b, secret))
    print(f"\nB refused the revoked key after {seconds * 1e3:.0f} ms")
    # the bound itself, independent of how fast the poller runs: whatever B would judge
    # by after MAX_STALE_S was read after the revocation
    time.sleep(max(0.0, revoked_at + auth.MAX_STALE_S - time.monotonic()))
    with pytest.raises(Unauthenticated):
        b.check(EMBED, f"Bearer {secret}")
    assert [k.revoked for k in b.list() if k.key_id == info.key_id] == [True]


def test_the_bound_holds_when_the_poller_stalls(two, monkeypatch):
    """A server whose re-reads stopped (a stuck poller, PostgreSQL gone) refuses to judge
    keys on an old read: Unavailable once it is MAX_STALE_S old, not the old answer."""
    a, b = two
    _, secret = a.create("t1", ["read"])
    until(lambda: accepts(b, secret))
    monkeypatch.setattr(b, "_read_at", time.monotonic() - auth.MAX_STALE_S - 0.1)
    b._follower.close()  # nothing refreshes it any more
    with pytest.raises(Unavailable) as e:
        b.check(EMBED, f"Bearer {secret}")
    assert "API keys cannot be checked" in str(e.value) and e.value.retry_after > 0


def test_the_secrets_are_stored_hashed(two, pg_store):
    a, _ = two
    secrets = [a.create("t1", ["read"])[1] for _ in range(3)]
    with psycopg.connect(pg_store.url) as c:
        raw = repr(c.execute("SELECT * FROM rp_keys").fetchall())
    assert all(s not in raw and s.split("_", 2)[2] not in raw for s in secrets)


def test_the_bootstrap_key_of_servers_starting_together_is_one_key(two):
    a, b = two
    for store in (a, b, a):
        store.ensure("the-bootstrap-secret", "default", auth.SCOPES, "bootstrap admin key")
    assert len(a.list()) == 1
    assert b.check("/ragplane.v1.AdminService/Flip", "Bearer the-bootstrap-secret").tenant == (
        "default"
    )


def test_postgres_down_is_unavailable_and_back_without_a_restart():
    """Its own PostgreSQL: this one is stopped and started."""
    from ragplane.testkit.postgres import LocalPostgres

    with LocalPostgres() as pg:
        store = PgStore(pg.create_database("keys"))
        store.migrate()
        keys = in_postgres(store)
        try:
            _, secret = keys.create("t1", ["read"])
            pg.pg_ctl("stop")
            # within MAX_STALE_S the last read still judges; after it, nothing does
            time.sleep(auth.MAX_STALE_S + 0.1)
            with pytest.raises(Unavailable) as e:
                keys.check(EMBED, f"Bearer {secret}")
            assert "unreachable" in str(e.value)  # the poller's reason, passed on
            with pytest.raises(Unavailable):
                keys.check(EMBED, "")  # not anonymous: it cannot know that keys exist
            with pytest.raises(Unavailable):
                keys.create("t1", ["read"])
            with pytest.raises(Unavailable):
                keys.list()
            pg.pg_ctl("start")

            def back() -> bool:
                try:
                    return accepts(keys, secret)
                except Unavailable:  # until the next re-read
                    return False

            print(f"\nkeys judged again {until(back):.1f} s after PostgreSQL came back")
            assert len(keys.list()) == 1
        finally:
            keys.close()
            store.close()
