"""The SQLite schema: the source of truth for collections and items.

`items` holds one row per vector: an item is one row, or one row per chunk when its text
was split (`chunk` 0, 1, ...; `c_start`/`c_end` its offsets in the item's text, in code
points; `c_end` -1 for a row covering the whole text in a collection without chunking).
Every row of an item carries its id and metadata, so filters apply per row; its `text` is
what was embedded and what the lexical index holds: the chunk's text. The whole text of a
split item lives once, in `item_text`, keyed by the seq of its chunk 0.

`items.seq` (AUTOINCREMENT, never reused) is the FAISS id of a row's vector and the rowid
of its text in the collection's lexical index (`ragplane.index.lexical`). An upsert
of an existing id tombstones the old rows (`deleted = 1`) and inserts new ones, so every
vector a FAISS index holds stays addressable until a compaction drops tombstoned rows.
"""

from __future__ import annotations

import sqlite3

from ragplane.index import lexical

DB_NAME = "ragplane.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT    NOT NULL,
    kind        TEXT    NOT NULL DEFAULT 'collection',  -- collection | memory (index.types.Kind)
    name        TEXT    NOT NULL,
    dim         INTEGER NOT NULL,
    metric      TEXT    NOT NULL,
    index_type  TEXT    NOT NULL,   -- as requested; the built kind is per generation
    embedder    TEXT    NOT NULL,
    params      TEXT    NOT NULL,   -- IndexParams as requested (JSON)
    generation  INTEGER NOT NULL,   -- the active generation
    created_at  REAL    NOT NULL,
    lexical     INTEGER NOT NULL DEFAULT 1,  -- keeps lex_<id>, an FTS5 index (index.lexical)
    chunking    TEXT    NOT NULL DEFAULT '', -- index.types.Chunking as JSON; '' = off
    UNIQUE (tenant, kind, name)
);
CREATE TABLE IF NOT EXISTS items (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    coll_id   INTEGER NOT NULL,
    item_id   TEXT    NOT NULL,
    vector    BLOB    NOT NULL,     -- float32 [dim], L2-normalised for cosine collections
    text      TEXT    NOT NULL,
    metadata  TEXT    NOT NULL,     -- JSON object
    deleted   INTEGER NOT NULL DEFAULT 0,
    chunk     INTEGER NOT NULL DEFAULT 0,   -- position of the chunk in its item
    c_start   INTEGER NOT NULL DEFAULT 0,   -- the chunk is text[c_start:c_end] of the item
    c_end     INTEGER NOT NULL DEFAULT -1   -- -1: the whole text (a collection without chunking)
);
-- The whole text of an item split into several chunks, by the seq of its chunk 0.
CREATE TABLE IF NOT EXISTS item_text (
    seq   INTEGER PRIMARY KEY,
    text  TEXT    NOT NULL
);
-- One row per index generation. state: building | active | previous | failed | retired.
CREATE TABLE IF NOT EXISTS generations (
    coll_id     INTEGER NOT NULL,
    generation  INTEGER NOT NULL,
    index_type  TEXT    NOT NULL,   -- requested type
    built_kind  TEXT    NOT NULL,   -- what FAISS holds (ivf_pq falls back to flat until trainable)
    params      TEXT    NOT NULL,   -- resolved IndexParams (JSON)
    requested   TEXT    NOT NULL,   -- IndexParams as requested (JSON)
    embedder    TEXT    NOT NULL,
    dim         INTEGER NOT NULL,
    state       TEXT    NOT NULL,
    created_at  REAL    NOT NULL,
    PRIMARY KEY (coll_id, generation)
);
-- Vectors re-embedded by a rebuild that has not swapped yet.
CREATE TABLE IF NOT EXISTS staged_vectors (
    coll_id INTEGER NOT NULL, generation INTEGER NOT NULL,
    seq INTEGER NOT NULL, vector BLOB NOT NULL,
    PRIMARY KEY (coll_id, generation, seq)
);
-- The vectors a re-embedding rebuild replaced, kept so `rollback` can restore them.
CREATE TABLE IF NOT EXISTS prev_vectors (
    coll_id INTEGER NOT NULL, generation INTEGER NOT NULL,
    seq INTEGER NOT NULL, vector BLOB NOT NULL,
    PRIMARY KEY (coll_id, generation, seq)
);
"""


# Created after the upgrades: an older store's tables lack the columns until they ran.
INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS items_live_id ON items (coll_id, item_id, chunk)
    WHERE deleted = 0;
CREATE INDEX IF NOT EXISTS items_coll_seq ON items (coll_id, deleted, seq);
"""

SCHEMA_VERSION = 3  # PRAGMA user_version of a store this code wrote or upgraded

# Version 0 kept memory namespaces as collections of a made-up tenant "memory:<tenant>".
# Version 1 gives them their own kind; the UNIQUE constraint changes, so SQLite needs the
# table rebuilt. Ids are kept (items, generations and index directories refer to them), and
# so is the AUTOINCREMENT high-water mark, so a dropped collection's id is never reused.
_MIGRATE_V1 = """
BEGIN IMMEDIATE;
CREATE TABLE collections_v1 (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT    NOT NULL,
    kind        TEXT    NOT NULL DEFAULT 'collection',
    name        TEXT    NOT NULL,
    dim         INTEGER NOT NULL,
    metric      TEXT    NOT NULL,
    index_type  TEXT    NOT NULL,
    embedder    TEXT    NOT NULL,
    params      TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    created_at  REAL    NOT NULL,
    UNIQUE (tenant, kind, name)
);
INSERT INTO collections_v1 (id, tenant, kind, name, dim, metric, index_type, embedder, params,
                            generation, created_at)
SELECT id,
       CASE WHEN substr(tenant, 1, 7) = 'memory:' THEN substr(tenant, 8) ELSE tenant END,
       CASE WHEN substr(tenant, 1, 7) = 'memory:' THEN 'memory' ELSE 'collection' END,
       name, dim, metric, index_type, embedder, params, generation, created_at
FROM collections;
CREATE TEMP TABLE seq_v0 AS SELECT seq FROM sqlite_sequence WHERE name = 'collections';
DROP TABLE collections;
ALTER TABLE collections_v1 RENAME TO collections;
DELETE FROM sqlite_sequence WHERE name = 'collections';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'collections', MAX(COALESCE((SELECT seq FROM seq_v0), 0),
                          COALESCE((SELECT MAX(id) FROM collections), 0));
DROP TABLE seq_v0;
PRAGMA user_version = 1;
COMMIT;
"""


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """Version 2 gives every collection a lexical index: the `lexical` column, and each
    collection's FTS5 table filled from its live items, in one transaction, so a store is
    either wholly upgraded or untouched (an interrupted upgrade runs again at next open)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("ALTER TABLE collections ADD COLUMN lexical INTEGER NOT NULL DEFAULT 1")
        for (coll_id,) in conn.execute("SELECT id FROM collections").fetchall():
            lexical.create(conn, coll_id)
            lexical.backfill(conn, coll_id)
        conn.execute("PRAGMA user_version = 2")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _migrate_v3(conn: sqlite3.Connection) -> None:
    """Version 3 gives items chunks: the chunk columns (every existing row is chunk 0 of its
    item, covering the whole text), `item_text`, the collections' `chunking` ('' = off, so
    they keep what they had), and the live-id index over (item, chunk). One transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for ddl in (
            "ALTER TABLE items ADD COLUMN chunk INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE items ADD COLUMN c_start INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE items ADD COLUMN c_end INTEGER NOT NULL DEFAULT -1",
            "ALTER TABLE collections ADD COLUMN chunking TEXT NOT NULL DEFAULT ''",
            "DROP INDEX IF EXISTS items_live_id",
        ):
            conn.execute(ddl)
        conn.execute("PRAGMA user_version = 3")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def init_schema(conn: sqlite3.Connection) -> None:
    """Create the tables of a new store, or upgrade an older store in place."""
    cols = _columns(conn, "collections")
    if cols and "kind" not in cols:
        try:
            conn.executescript(_MIGRATE_V1)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    conn.executescript(SCHEMA)
    if "lexical" not in _columns(conn, "collections"):
        _migrate_v2(conn)
    if "chunk" not in _columns(conn, "items"):
        _migrate_v3(conn)
    conn.executescript(INDEXES)
    if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        # only when it changes: opening a current store writes nothing, so it opens on a full disk
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
