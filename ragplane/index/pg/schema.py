"""The PostgreSQL schema of a shared store, versioned and upgraded in place.

Every server runs `migrate` at start, under a session advisory lock, so N servers starting
at once never race: the first creates or upgrades, the others wait and find it done.

Tables (all prefixed `rp_`):
- `rp_meta`: one row: the schema version and the store's id (a uuid, so a server's local
  cache can tell that it follows this store and not another one).
- `rp_head`: one row, the position of the last change. A writer bumps it first thing in
  its transaction, which takes the row's lock until commit: positions are handed out in
  commit order, so a reader that has seen position P has seen every commit before it.
- `rp_changes`: the change log (position -> one operation as JSON: `changes.Op`).
- `rp_collections`, `rp_items`: the current state, from which a server that fell behind
  further than the log keeps rebuilds its indexes.
- `rp_embeddings`: the vectors a re-embedding rebuild computed, by embedder and the text's
  sha256, so the other servers rebuild the same generation without embedding again.

Version 2, the servers' own state that a SQLite data directory keeps in keys.db and
shadow.db, shared so that every server of a cluster acts the same:
- `rp_keys`: the API keys (server.auth), hashed; a key made on one server authenticates
  on all, a revoked one is refused by all.
- `rp_shadow_evidence`, `rp_shadow_timings`, `rp_shadow_overlap`: the shadow's evidence
  (server.shadow.evidence), recorded by every server's shadow worker.
- `rp_shadow_state`, `rp_shadow_history`: which embedder serves each case of use, and
  every flip and unflip: a flip is cluster-wide.
Their columns are those of the SQLite tables (ragplane.core.serverdb: one set of statements
for both), with double precision for SQLite's REAL and bigint for counters.

Version 3: `rp_expect_head(p)`, which fails its transaction (serialization_failure) unless
the head is `p`: an upsert sends its COMMIT before it knows its position, guarded by it.

Version 4: the shadow's evidence counts batches skipped while busy, those sampled while
busy, and observed time per class (`skipped`, `busy`, `active_s`: server.shadow.evidence).

Version 5: `rp_changes` loses its `vectors` column, always empty (an upsert's items and
their vectors are in `rp_items` alone; `changes.Upsert` reads them there). A server of an
older version still names the column in its writes: stop every one before a server of
this version starts (the upgrade is one `ALTER TABLE`, the log's rows are kept).
"""

from __future__ import annotations

import uuid
from typing import Any, LiteralString

import psycopg

# Any fixed 64-bit number: the advisory lock of schema changes.
MIGRATE_LOCK = 0x7261_6770_6C61_6E65  # "ragplane"
VERSION = 5

_V1 = """
CREATE TABLE rp_meta (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    version    integer NOT NULL,
    store_id   text NOT NULL
);
CREATE TABLE rp_head (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    pos        bigint NOT NULL
);
INSERT INTO rp_head (pos) VALUES (0);
CREATE TABLE rp_changes (
    pos        bigint PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    op         jsonb NOT NULL,
    vectors    bytea
);
CREATE TABLE rp_collections (
    tenant     text NOT NULL,
    kind       text NOT NULL,
    name       text NOT NULL,
    config     jsonb NOT NULL,
    PRIMARY KEY (tenant, kind, name)
);
CREATE TABLE rp_items (
    tenant     text NOT NULL,
    kind       text NOT NULL,
    coll       text NOT NULL,
    id         text NOT NULL,
    pos        bigint NOT NULL,
    body       jsonb NOT NULL,
    vectors    bytea NOT NULL,
    PRIMARY KEY (tenant, kind, coll, id)
);
CREATE INDEX rp_items_pos ON rp_items (tenant, kind, coll, pos);
-- float32 vectors do not compress: store them as they are
ALTER TABLE rp_items ALTER COLUMN vectors SET STORAGE EXTERNAL;
ALTER TABLE rp_changes ALTER COLUMN vectors SET STORAGE EXTERNAL;
CREATE TABLE rp_embeddings (
    embedder   text NOT NULL,
    sha        bytea NOT NULL,
    vector     bytea NOT NULL,
    PRIMARY KEY (embedder, sha)
);
"""

_SHADOW_KEY = """
    use_case   text NOT NULL,
    release    text NOT NULL,
    canonical  text NOT NULL,
    hardware   text NOT NULL,
    phase      text NOT NULL"""

_V2 = f"""
CREATE TABLE rp_keys (
    key_id      text PRIMARY KEY,
    tenant      text NOT NULL,
    scopes      text NOT NULL,
    hash        text NOT NULL,
    description text NOT NULL,
    created_at  double precision NOT NULL,
    revoked     integer NOT NULL DEFAULT 0
);
CREATE TABLE rp_shadow_evidence ({_SHADOW_KEY},
    class      text NOT NULL,
    batches    bigint NOT NULL DEFAULT 0,
    samples    bigint NOT NULL DEFAULT 0,
    cos_min    double precision NOT NULL DEFAULT 1.0,
    cos_sum    double precision NOT NULL DEFAULT 0.0,
    low        text NOT NULL DEFAULT '[]',
    errors     bigint NOT NULL DEFAULT 0,
    last_error text NOT NULL DEFAULT '',
    dropped    bigint NOT NULL DEFAULT 0,
    first_at   double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (use_case, release, canonical, hardware, phase, class)
);
CREATE TABLE rp_shadow_timings (
    seq        bigserial PRIMARY KEY, {_SHADOW_KEY},
    class      text NOT NULL,
    at         double precision NOT NULL,
    t1         double precision NOT NULL,
    t2         double precision NOT NULL,
    t3         double precision NOT NULL,
    shadow_first integer NOT NULL
);
CREATE INDEX rp_shadow_timings_key ON rp_shadow_timings (use_case, release, phase, class);
CREATE TABLE rp_shadow_overlap ({_SHADOW_KEY},
    overlap    double precision NOT NULL,
    probes     integer NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (use_case, release, canonical, hardware, phase)
);
CREATE TABLE rp_shadow_state (
    use_case   text PRIMARY KEY,
    serving    text NOT NULL,
    updated_at double precision NOT NULL
);
CREATE TABLE rp_shadow_history (
    seq        bigserial PRIMARY KEY,  -- commit order (under the state row's lock)
    use_case   text NOT NULL,
    at         double precision NOT NULL,
    action     text NOT NULL,
    serving    text NOT NULL,
    forced     integer NOT NULL,
    reason     text NOT NULL
);
CREATE INDEX rp_shadow_history_case ON rp_shadow_history (use_case, seq);
"""

_V3 = """
CREATE FUNCTION rp_expect_head(want bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT pos FROM rp_head) <> want THEN
        RAISE EXCEPTION 'another server wrote before position %', want
            USING ERRCODE = 'serialization_failure';
    END IF;
END $$;
"""

_V4 = """
ALTER TABLE rp_shadow_evidence
    ADD COLUMN skipped bigint NOT NULL DEFAULT 0,
    ADD COLUMN busy bigint NOT NULL DEFAULT 0,
    ADD COLUMN active_s double precision NOT NULL DEFAULT 0.0;
"""

_V5 = """
ALTER TABLE rp_changes DROP COLUMN vectors;
"""

# version -> the statements that bring the schema from version-1 to it
UPGRADES: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5}

# The server's own tables (version 2) by the names its modules use for them (see
# ragplane.core.serverdb): keys, the shadow's evidence, timings, overlap, state, history.
SERVER_TABLES = {
    "keys": "rp_keys", "evidence": "rp_shadow_evidence", "timings": "rp_shadow_timings",
    "overlap": "rp_shadow_overlap", "state": "rp_shadow_state",
    "history": "rp_shadow_history", "seq": "seq",
}


def _one(conn: psycopg.Connection[Any], sql: LiteralString) -> Any:
    """The one value of a one-row query."""
    row = conn.execute(sql).fetchone()
    assert row is not None, sql
    return row[0]


def current_version(conn: psycopg.Connection[Any]) -> int:
    if not _one(conn, "SELECT to_regclass('rp_meta') IS NOT NULL"):
        return 0
    return int(_one(conn, "SELECT version FROM rp_meta"))


def migrate(conn: psycopg.Connection[Any], upgrades: dict[int, str] | None = None) -> str:
    """Create or upgrade the schema to the newest version; returns the store's id. Runs
    under the migration advisory lock; each version's step commits on its own."""
    steps = UPGRADES if upgrades is None else upgrades
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
    try:
        have = current_version(conn)
        for version in sorted(v for v in steps if v > have):
            with conn.transaction():
                conn.execute(steps[version])
                if version == 1:
                    conn.execute(
                        "INSERT INTO rp_meta (version, store_id) VALUES (1, %s)",
                        (uuid.uuid4().hex,),
                    )
                else:
                    conn.execute("UPDATE rp_meta SET version = %s", (version,))
        return str(_one(conn, "SELECT store_id FROM rp_meta"))
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))
