"""The lexical index of a collection: an FTS5 table over its live items' text, BM25-ranked.

One table per collection, `lex_<collection id>`, so BM25's statistics (document count,
average length, each word's document frequency) are the collection's own, dropping a
collection drops its index, and a collection created without one has none. The table is
contentless (`content=''`): the text stays in `items` only, and the table maps words to
`items.seq` (its rowid).

Every statement runs on the connection it is given; writers call these inside the
transaction that writes the items (`Context.tx()`), so the index holds exactly the live
rows of every committed state: a crash can never leave it and the items apart. A tombstoned
row leaves the index when it is tombstoned (FTS5's 'delete' needs the text it indexed,
which `items` keeps), so compaction has nothing to do here.

Scores are FTS5's bm25() negated: higher is better, as for every other score.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from ragplane.index.fts_query import TOKENIZE

Conn = sqlite3.Connection


def table(coll_id: int) -> str:
    return f"lex_{int(coll_id)}"


def create(c: Conn, coll_id: int) -> None:
    c.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {table(coll_id)} "
        f"USING fts5(text, content='', tokenize='{TOKENIZE}')"
    )


def drop(c: Conn, coll_id: int) -> None:
    c.execute(f"DROP TABLE IF EXISTS {table(coll_id)}")


def backfill(c: Conn, coll_id: int) -> None:
    """Index every live item of the collection (a table just created, or upgraded)."""
    c.execute(
        f"INSERT INTO {table(coll_id)} (rowid, text) "
        "SELECT seq, text FROM items WHERE coll_id = ? AND deleted = 0",
        (coll_id,),
    )


def add(c: Conn, coll_id: int, rows: Iterable[tuple[int, str]]) -> None:
    """Index (seq, text) rows just inserted into `items`."""
    c.executemany(f"INSERT INTO {table(coll_id)} (rowid, text) VALUES (?, ?)", rows)


def remove(c: Conn, coll_id: int, rows: Iterable[tuple[int, str]]) -> None:
    """Unindex (seq, text) rows just tombstoned; `text` must be what was indexed."""
    t = table(coll_id)
    c.executemany(f"INSERT INTO {t} ({t}, rowid, text) VALUES ('delete', ?, ?)", rows)


def size(c: Conn, coll_id: int) -> tuple[int, int]:
    """(rows, token instances) in the collection's index: FTS5's own totals, the varints of
    the 'averages' record (id 1) of its data table, which bm25() reads for its average
    row length. (0, 0) for an index never written to."""
    row = c.execute(f"SELECT block FROM {table(coll_id)}_data WHERE id = 1").fetchone()
    values, v, n = [], 0, 0
    for byte in row[0] if row else b"":  # SQLite varints: 7 bits a byte, high bit = more
        n += 1
        if n == 9:  # the ninth byte carries 8 bits
            values.append((v << 8) | byte)
            v, n = 0, 0
            continue
        v = (v << 7) | (byte & 0x7F)
        if not byte & 0x80:
            values.append(v)
            v, n = 0, 0
    return (values[0], values[1]) if len(values) >= 2 else (0, 0)


def temp_tables(c: Conn, coll_id: int) -> None:
    """This connection's helpers: a scratch FTS5 table with the collection's tokenizer (to
    tokenise query words exactly as the index does), and views of the collection's
    document frequencies and of its token instances (`ragplane.index.postings`). In the
    connection's temp schema, kept in memory: nothing is written to the store or the disk
    (a search works on a full or read-only disk)."""
    if c.execute("PRAGMA temp_store").fetchone()[0] != 2:
        c.execute("PRAGMA temp_store = MEMORY")  # drops temp tables: only before the first
    c.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.lex_tok "
        f"USING fts5(text, content='', tokenize='{TOKENIZE}')"
    )
    c.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.lex_tokens USING fts5vocab(temp, lex_tok, "
        "'instance')"
    )
    c.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{table(coll_id)}_df "
        f"USING fts5vocab(main, {table(coll_id)}, 'row')"
    )
    c.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{table(coll_id)}_inst "
        f"USING fts5vocab(main, {table(coll_id)}, 'instance')"
    )


def tokens(c: Conn, coll_id: int, words: Sequence[str]) -> list[tuple[str, ...]]:
    """Each of `words` as the collection's tokenizer splits it, in order (a scratch FTS5
    table of `temp_tables`, emptied again)."""
    temp_tables(c, coll_id)
    c.executemany("INSERT INTO temp.lex_tok (rowid, text) VALUES (?, ?)", enumerate(words))
    try:
        found: dict[int, list[tuple[int, str]]] = {}
        for doc, term, off in c.execute("SELECT doc, term, offset FROM temp.lex_tokens"):
            found.setdefault(doc, []).append((off, term))
    finally:
        c.execute("INSERT INTO temp.lex_tok (lex_tok) VALUES ('delete-all')")
    return [tuple(t for _, t in sorted(found.get(i, []))) for i in range(len(words))]


def weightless(c: Conn, coll_id: int, terms: Sequence[str], n_docs: int) -> set[str]:
    """The one-token `terms` that half or more of the collection's `n_docs` items contain.

    FTS5's bm25() floors such a word's idf, log((N - n + 0.5) / (n + 0.5)) <= 0, at 1e-6, so
    it cannot lift an item above one that holds any other query word; but matching it makes
    FTS5 score most of the collection (a query with "the" scores nearly every item).
    Leaving these words out keeps the ranking and skips that work."""
    if not terms or n_docs <= 0:
        return set()
    single = {i: t[0] for i, t in enumerate(tokens(c, coll_id, terms)) if len(set(t)) == 1}
    if not single:
        return set()
    df = dict(
        c.execute(
            f"SELECT term, doc FROM temp.{table(coll_id)}_df "
            "WHERE term IN (SELECT value FROM json_each(?))",
            (json.dumps(sorted(set(single.values()))),),
        ).fetchall()
    )
    return {terms[i] for i, tok in single.items() if 2 * df.get(tok, 0) >= n_docs}


def ranked(
    c: Conn, coll_id: int, match: str, limit: int, where: str = "", args: Sequence[Any] = ()
) -> list[tuple[int, str, float]]:
    """(seq, item id, score) of the best `limit` live items matching the FTS5 expression
    `match` (from ragplane.index.fts_query) and, when given, the filter SQL `where` over `items`;
    best first, ties by item id. Exact: FTS5 scores every matching item."""
    t = table(coll_id)
    if not where:
        # FTS5 keeps only the best `limit` while it scans when ORDER BY rank has a LIMIT.
        top = c.execute(
            f"SELECT rowid, -bm25({t}) FROM {t} WHERE {t} MATCH ? ORDER BY rank LIMIT ?",
            (match, limit),
        ).fetchall()
        ids = dict(
            c.execute(
                "SELECT seq, item_id FROM items WHERE seq IN (SELECT value FROM json_each(?))",
                (json.dumps([r[0] for r in top]),),
            ).fetchall()
        )
        rows = [(seq, ids[seq], s) for seq, s in top if seq in ids]
        return sorted(rows, key=lambda r: (-r[2], r[1]))
    return c.execute(
        f"SELECT i.seq, i.item_id, -bm25({t}) AS s FROM {t} JOIN items i ON i.seq = {t}.rowid "
        f"WHERE {t} MATCH ? AND i.deleted = 0 AND ({where}) ORDER BY s DESC, i.item_id LIMIT ?",
        [match, *args, limit],
    ).fetchall()


def all_scores(c: Conn, coll_id: int, match: str) -> dict[int, float]:
    """seq -> score of every row matching `match`. FTS5 scores every matching row for any
    ranking (with or without LIMIT), so keeping them all costs little more than the best n,
    and answers later score lookups without a seek each."""
    t = table(coll_id)
    return dict(c.execute(f"SELECT rowid, -bm25({t}) FROM {t} WHERE {t} MATCH ?",
                          (match,)).fetchall())


def scores_of_seqs(c: Conn, coll_id: int, match: str, seqs: Sequence[int]) -> dict[int, float]:
    """The score of each row of `seqs` (a chunk, or an unsplit item) that matches `match`;
    the others contain no query word. One lookup per row: FTS5 seeks a `rowid =`
    constraint, where a join or an IN list would score every matching row first."""
    t = table(coll_id)
    sql = f"SELECT -bm25({t}) FROM {t} WHERE {t} MATCH ? AND rowid = ?"
    out = {}
    for seq in seqs:
        row = c.execute(sql, (match, seq)).fetchone()
        if row is not None:
            out[seq] = row[0]
    return out
