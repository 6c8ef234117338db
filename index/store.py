"""The SQLite schema: the source of truth for collections and items.

`items.seq` (AUTOINCREMENT, never reused) is the FAISS id of an item's vector. An upsert
of an existing id tombstones the old row (`deleted = 1`) and inserts a new one, so every
vector a FAISS index holds stays addressable until a compaction drops tombstoned rows.
"""

from __future__ import annotations

import sqlite3

DB_NAME = "ragplane.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    dim         INTEGER NOT NULL,
    metric      TEXT    NOT NULL,
    index_type  TEXT    NOT NULL,   -- as requested; the built kind is per generation
    embedder    TEXT    NOT NULL,
    params      TEXT    NOT NULL,   -- IndexParams as requested (JSON)
    generation  INTEGER NOT NULL,   -- the active generation
    created_at  REAL    NOT NULL,
    UNIQUE (tenant, name)
);
CREATE TABLE IF NOT EXISTS items (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    coll_id   INTEGER NOT NULL,
    item_id   TEXT    NOT NULL,
    vector    BLOB    NOT NULL,     -- float32 [dim], L2-normalised for cosine collections
    text      TEXT    NOT NULL,
    metadata  TEXT    NOT NULL,     -- JSON object
    deleted   INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS items_live_id ON items (coll_id, item_id) WHERE deleted = 0;
CREATE INDEX IF NOT EXISTS items_coll_seq ON items (coll_id, deleted, seq);
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


def init_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
