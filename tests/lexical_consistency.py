"""Checks that a store's lexical indexes hold exactly what a fresh index of its live items
would: the same (word, item) postings, no more, no less, per collection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ragplane.index.fts_query import TOKENIZE
from ragplane.index.lexical import table
from ragplane.index.store import DB_NAME


def _postings(db: sqlite3.Connection, schema: str, name: str) -> list[tuple]:
    vocab = f"v_{name}"
    db.execute(f"CREATE VIRTUAL TABLE temp.{vocab} USING fts5vocab({schema}, {name}, 'instance')")
    try:
        return sorted(db.execute(f"SELECT term, doc, offset FROM temp.{vocab}").fetchall())
    finally:
        db.execute(f"DROP TABLE temp.{vocab}")


def assert_lexical_matches_items(data_dir: Path) -> int:
    """Assert every collection's lexical index equals a fresh index of its live items (and
    that collections without one have no table). Returns the number of items checked."""
    db = sqlite3.connect(data_dir / DB_NAME)
    checked = 0
    try:
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for coll_id, has_lexical in db.execute("SELECT id, lexical FROM collections").fetchall():
            if not has_lexical:
                assert table(coll_id) not in tables, f"collection {coll_id}: stray lexical table"
                continue
            live = db.execute(
                "SELECT seq, text FROM items WHERE coll_id = ? AND deleted = 0", (coll_id,)
            ).fetchall()
            db.execute(
                f"CREATE VIRTUAL TABLE temp.ref USING fts5(text, content='', tokenize='{TOKENIZE}')"
            )
            try:
                db.executemany("INSERT INTO temp.ref (rowid, text) VALUES (?, ?)", live)
                have = _postings(db, "main", table(coll_id))
                want = _postings(db, "temp", "ref")
            finally:
                db.execute("DROP TABLE temp.ref")
            assert have == want, f"collection {coll_id}: lexical index and items differ"
            rowids = {r for (r,) in db.execute(f"SELECT rowid FROM {table(coll_id)}")}
            assert rowids == {s for s, _ in live}, f"collection {coll_id}: rows differ"
            checked += len(live)
        return checked
    finally:
        db.close()
