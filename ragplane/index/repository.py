"""Every SQL statement of the engine, one function per statement group.

Functions take a connection: a reader for queries, the writer inside `Context.tx()` for
changes. Nothing here holds locks or touches FAISS.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ragplane.index import lexical
from ragplane.index.state import blob_matrix, params_from, params_json
from ragplane.index.types import IndexParams, IndexType

READ_BATCH = 4096
_ALL = 1 << 62
Conn = sqlite3.Connection

# ------------------------------------------------------------------ collections


def fail_unfinished_builds(c: Conn) -> None:
    """A rebuild that was running when the process died never swapped: drop it."""
    for coll_id, gen in c.execute(
        "SELECT coll_id, generation FROM generations WHERE state = 'building'"
    ).fetchall():
        c.execute(
            "DELETE FROM staged_vectors WHERE coll_id = ? AND generation = ?", (coll_id, gen)
        )
        c.execute(
            "UPDATE generations SET state = 'failed' WHERE coll_id = ? AND generation = ?",
            (coll_id, gen),
        )
    c.execute("DELETE FROM staged_vectors")


def collection_rows(c: Conn) -> list[tuple[Any, ...]]:
    return c.execute(
        "SELECT id, tenant, name, dim, metric, index_type, embedder, params, generation, "
        "created_at, kind, lexical, chunking FROM collections"
    ).fetchall()


def insert_collection(
    c: Conn, tenant: str, purpose: str, name: str, dim: int, metric: str, requested: IndexParams,
    index_type: IndexType, built_type: IndexType, resolved: IndexParams, embedder: str, now: float,
    with_lexical: bool, chunking: str,
) -> int:
    coll_id = c.execute(
        "INSERT INTO collections (tenant, kind, name, dim, metric, index_type, embedder, params, "
        "generation, created_at, lexical, chunking) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)",
        (tenant, purpose, name, dim, metric, index_type.value, embedder, params_json(requested),
         now, int(with_lexical), chunking),
    ).lastrowid
    assert coll_id is not None  # an INSERT's row
    if with_lexical:
        lexical.create(c, coll_id)
    c.execute(
        "INSERT INTO generations (coll_id, generation, index_type, built_kind, params, "
        "requested, embedder, dim, state, created_at) "
        "VALUES (?, 1, ?, ?, ?, ?, ?, ?, 'active', ?)",
        (
            coll_id, index_type.value, built_type.value, params_json(resolved),
            params_json(requested), embedder, dim, now,
        ),
    )
    return coll_id


def delete_collection(c: Conn, coll_id: int) -> None:
    c.execute("DELETE FROM item_text WHERE seq IN (SELECT seq FROM items WHERE coll_id = ?)",
              (coll_id,))
    for table in ("items", "generations", "staged_vectors", "prev_vectors"):
        c.execute(f"DELETE FROM {table} WHERE coll_id = ?", (coll_id,))
    c.execute("DELETE FROM collections WHERE id = ?", (coll_id,))
    lexical.drop(c, coll_id)


def set_embedder(c: Conn, coll_id: int, generation: int, embedder: str) -> None:
    c.execute("UPDATE collections SET embedder = ? WHERE id = ?", (embedder, coll_id))
    c.execute(
        "UPDATE generations SET embedder = ? WHERE coll_id = ? AND generation = ?",
        (embedder, coll_id, generation),
    )


# ------------------------------------------------------------------ generations


def kept_generations(c: Conn, coll_id: int) -> set[int]:
    """Generations whose checkpoints are worth keeping (active, and previous for rollback)."""
    return {
        g
        for (g,) in c.execute(
            "SELECT generation FROM generations WHERE coll_id = ? "
            "AND state IN ('active', 'previous')",
            (coll_id,),
        )
    }


def generation_build(c: Conn, coll_id: int, generation: int) -> tuple[IndexType, IndexParams]:
    """What the generation's FAISS index is (built_type, resolved params)."""
    row = c.execute(
        "SELECT built_kind, params FROM generations WHERE coll_id = ? AND generation = ?",
        (coll_id, generation),
    ).fetchone()
    if row is None:
        raise RuntimeError(f"generation {generation} of collection {coll_id} is missing")
    return IndexType(row[0]), params_from(row[1])


def begin_generation(
    c: Conn, coll_id: int, target: IndexType, requested: IndexParams, embedder: str, dim: int
) -> int:
    """Record a new generation in state 'building'; returns its number."""
    (gen,) = c.execute(
        "SELECT COALESCE(MAX(generation), 0) + 1 FROM generations WHERE coll_id = ?", (coll_id,)
    ).fetchone()
    c.execute(
        "INSERT INTO generations (coll_id, generation, index_type, built_kind, params, "
        "requested, embedder, dim, state, created_at) "
        "VALUES (?, ?, ?, ?, '{}', ?, ?, ?, 'building', ?)",
        (coll_id, gen, target.value, target.value, params_json(requested), embedder, dim,
         time.time()),
    )
    return int(gen)


def stage_vectors(c: Conn, coll_id: int, gen: int, seqs: np.ndarray, vecs: np.ndarray) -> None:
    c.executemany(
        "INSERT OR REPLACE INTO staged_vectors (coll_id, generation, seq, vector) "
        "VALUES (?, ?, ?, ?)",
        [(coll_id, gen, int(s), v.tobytes()) for s, v in zip(seqs, vecs, strict=True)],
    )


def fail_generation(c: Conn, coll_id: int, gen: int) -> None:
    c.execute("DELETE FROM staged_vectors WHERE coll_id = ? AND generation = ?", (coll_id, gen))
    c.execute(
        "UPDATE generations SET state = 'failed' WHERE coll_id = ? AND generation = ? "
        "AND state = 'building'",
        (coll_id, gen),
    )


def apply_staged_vectors(c: Conn, coll_id: int, old_gen: int, gen: int) -> None:
    """Keep the vectors a re-embedding replaces (for rollback), then replace them."""
    c.execute(
        "INSERT INTO prev_vectors (coll_id, generation, seq, vector) "
        "SELECT coll_id, ?, seq, vector FROM items WHERE coll_id = ? AND seq IN "
        "(SELECT seq FROM staged_vectors WHERE coll_id = ? AND generation = ?)",
        (old_gen, coll_id, coll_id, gen),
    )
    c.execute(
        "UPDATE items SET vector = (SELECT s.vector FROM staged_vectors s WHERE s.coll_id = ? "
        "AND s.generation = ? AND s.seq = items.seq) WHERE coll_id = ? AND seq IN "
        "(SELECT seq FROM staged_vectors WHERE coll_id = ? AND generation = ?)",
        (coll_id, gen, coll_id, coll_id, gen),
    )
    c.execute("DELETE FROM staged_vectors WHERE coll_id = ? AND generation = ?", (coll_id, gen))


def activate_generation(
    c: Conn, coll_id: int, old_gen: int, gen: int, built_type: IndexType, resolved: IndexParams,
    target: IndexType, requested: IndexParams, embedder: str, dim: int, reembedded: bool,
) -> list[int]:
    """Make `gen` active and `old_gen` previous; returns the generations retired."""
    retired = [
        g
        for (g,) in c.execute(
            "SELECT generation FROM generations WHERE coll_id = ? AND state = 'previous'",
            (coll_id,),
        )
    ]
    c.execute("DELETE FROM prev_vectors WHERE coll_id = ?", (coll_id,))
    if reembedded:
        apply_staged_vectors(c, coll_id, old_gen, gen)
    c.execute(
        "UPDATE generations SET state = 'retired' WHERE coll_id = ? AND state = 'previous'",
        (coll_id,),
    )
    c.execute(
        "UPDATE generations SET state = 'previous' WHERE coll_id = ? AND generation = ?",
        (coll_id, old_gen),
    )
    c.execute(
        "UPDATE generations SET state = 'active', built_kind = ?, params = ?, dim = ? "
        "WHERE coll_id = ? AND generation = ?",
        (built_type.value, params_json(resolved), dim, coll_id, gen),
    )
    c.execute(
        "UPDATE collections SET generation = ?, index_type = ?, params = ?, embedder = ?, "
        "dim = ? WHERE id = ?",
        (gen, target.value, params_json(requested), embedder, dim, coll_id),
    )
    return retired


def previous_generation(c: Conn, coll_id: int) -> tuple[Any, ...] | None:
    """(generation, index_type, requested params JSON, embedder, dim) of the previous one."""
    row: tuple[Any, ...] | None = c.execute(
        "SELECT generation, index_type, requested, embedder, dim FROM generations "
        "WHERE coll_id = ? AND state = 'previous'",
        (coll_id,),
    ).fetchone()
    return row


def roll_back(c: Conn, coll_id: int, cur: int, prev: tuple[Any, ...]) -> None:
    """Restore the vectors `cur` replaced and make `prev` (a previous_generation row) active."""
    gen, index_type, requested, embedder, dim = prev
    c.execute(
        "UPDATE items SET vector = (SELECT p.vector FROM prev_vectors p WHERE p.coll_id = ? "
        "AND p.generation = ? AND p.seq = items.seq) WHERE coll_id = ? AND seq IN "
        "(SELECT seq FROM prev_vectors WHERE coll_id = ? AND generation = ?)",
        (coll_id, gen, coll_id, coll_id, gen),
    )
    c.execute("DELETE FROM prev_vectors WHERE coll_id = ?", (coll_id,))
    c.execute(
        "UPDATE generations SET state = 'retired' WHERE coll_id = ? AND generation = ?",
        (coll_id, cur),
    )
    c.execute(
        "UPDATE generations SET state = 'active' WHERE coll_id = ? AND generation = ?",
        (coll_id, gen),
    )
    c.execute(
        "UPDATE collections SET generation = ?, index_type = ?, params = ?, embedder = ?, "
        "dim = ? WHERE id = ?",
        (gen, index_type, requested, embedder, dim, coll_id),
    )


def purge_deleted(c: Conn, coll_id: int) -> int:
    """Drop tombstoned rows (and their rollback copies and whole texts); returns how many
    rows went."""
    c.execute(
        "DELETE FROM item_text WHERE seq IN "
        "(SELECT seq FROM items WHERE coll_id = ? AND deleted = 1)",
        (coll_id,),
    )
    c.execute(
        "DELETE FROM prev_vectors WHERE coll_id = ? AND seq IN "
        "(SELECT seq FROM items WHERE coll_id = ? AND deleted = 1)",
        (coll_id, coll_id),
    )
    gone = c.execute("DELETE FROM items WHERE coll_id = ? AND deleted = 1", (coll_id,))
    return int(gone.rowcount)


# ------------------------------------------------------------------ items: writes


# A row as written: (item id, chunk, c_start, c_end, text embedded, metadata JSON, the item's
# whole text when it was split into several chunks (on chunk 0 only), else None)
Row = tuple[str, int, int, int, str, str, "str | None"]


def replace_items(c: Conn, coll_id: int, rows: Sequence[Row], mat: np.ndarray,
                  with_lexical: bool) -> tuple[list[int], np.ndarray]:
    """Tombstone the live rows (every chunk) of these ids and insert new ones (and, with
    `with_lexical`, keep the collection's lexical index in step, in the same transaction).

    Returns (tombstoned seqs, new seqs in row order)."""
    old = c.execute(
        # without INDEXED BY the planner (no ANALYZE stats) scans every live row
        "UPDATE items INDEXED BY items_live_id SET deleted = 1 "
        "WHERE coll_id = ? AND deleted = 0 AND item_id IN "
        "(SELECT value FROM json_each(?)) RETURNING seq, text",
        (coll_id, json.dumps(sorted({r[0] for r in rows}))),
    ).fetchall()
    seqs = np.empty(len(rows), dtype=np.int64)
    ins = ("INSERT INTO items (coll_id, item_id, vector, text, metadata, chunk, c_start, c_end) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    for i, (item_id, chunk, start, end, text, md, whole) in enumerate(rows):
        seq = c.execute(
            ins, (coll_id, item_id, mat[i].tobytes(), text, md, chunk, start, end)
        ).lastrowid
        assert seq is not None  # an INSERT's row
        seqs[i] = seq
        if whole is not None:
            c.execute("INSERT INTO item_text (seq, text) VALUES (?, ?)", (int(seqs[i]), whole))
    if with_lexical:
        lexical.remove(c, coll_id, old)
        lexical.add(c, coll_id, zip(seqs.tolist(), (r[4] for r in rows), strict=True))
    return [s for s, _ in old], seqs


def tombstone(c: Conn, coll_id: int, where: str, args: Sequence[Any], by_id: bool,
              with_lexical: bool) -> tuple[list[int], int]:
    """Mark the live rows matching `where` deleted (and, `with_lexical`, unindex their text);
    returns their seqs and how many items they were (every chunk of an item carries its
    id and metadata, so a filter takes all of an item's chunks or none)."""
    table = "items INDEXED BY items_live_id" if by_id else "items"
    rows = c.execute(
        f"UPDATE {table} SET deleted = 1 WHERE coll_id = ? AND deleted = 0 AND "
        f"({where}) RETURNING seq, text, chunk",
        [coll_id, *args],
    ).fetchall()
    if with_lexical:
        lexical.remove(c, coll_id, [(s, t) for s, t, _ in rows])
    return [r[0] for r in rows], sum(1 for r in rows if r[2] == 0)


# ------------------------------------------------------------------ items: reads


def live_ids(c: Conn, coll_id: int) -> tuple[np.ndarray, list[str], list[int], int]:
    """(live seqs, their item ids, the seqs of chunks past an item's first, the highest seq
    ever written) of a collection."""
    live = c.execute(
        "SELECT seq, item_id, chunk FROM items WHERE coll_id = ? AND deleted = 0 ORDER BY seq",
        (coll_id,),
    ).fetchall()
    seqs = np.fromiter((r[0] for r in live), dtype=np.int64, count=len(live))
    (top,) = c.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM items WHERE coll_id = ?", (coll_id,)
    ).fetchone()
    return seqs, [r[1] for r in live], [r[0] for r in live if r[2]], int(top)


def iter_vectors(
    c: Conn, coll_id: int, dim: int, after: int, upto: int | None, *, text: bool = False
) -> Iterator[Any]:
    """Live rows with after < seq <= upto, in seq order, as batches of (seqs, vectors)
    or, with `text`, (seqs, vectors, texts)."""
    last, hi = after, upto if upto is not None else _ALL
    while True:
        rows = c.execute(
            "SELECT seq, vector" + (", text" if text else "") + " FROM items "
            "WHERE coll_id = ? AND deleted = 0 AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (coll_id, last, hi, READ_BATCH),
        ).fetchall()
        if not rows:
            return
        seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        vecs = blob_matrix([r[1] for r in rows], dim)
        last = int(seqs[-1])
        yield (seqs, vecs, [r[2] for r in rows]) if text else (seqs, vecs)


def read_vectors(
    c: Conn, coll_id: int, dim: int, after: int, upto: int | None
) -> tuple[np.ndarray, np.ndarray]:
    parts = list(iter_vectors(c, coll_id, dim, after, upto))
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.float32)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def vectors_of(c: Conn, seqs: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The stored vectors of `seqs` in seq order, and the seqs found."""
    rows = c.execute(
        "SELECT seq, vector FROM items WHERE seq IN (SELECT value FROM json_each(?)) "
        "ORDER BY seq",
        (json.dumps(seqs.tolist()),),
    ).fetchall()
    found = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    return found, blob_matrix([r[1] for r in rows], dim)


def count_live(c: Conn, coll_id: int, upto: int) -> int:
    (n,) = c.execute(
        "SELECT COUNT(*) FROM items WHERE coll_id = ? AND deleted = 0 AND seq <= ?",
        (coll_id, upto),
    ).fetchone()
    return int(n)


# An item's whole text: its own row's, or item_text's when it was split.
_WHOLE = "COALESCE((SELECT t.text FROM item_text t WHERE t.seq = items.seq), items.text)"


def items_by_id(
    c: Conn, coll_id: int, ids: Sequence[str], vectors: bool
) -> list[tuple[Any, ...]]:
    """(item_id, whole text, metadata JSON[, vector of chunk 0]) of the live items of `ids`,
    in no order."""
    cols = f"item_id, {_WHOLE}, metadata" + (", vector" if vectors else "")
    return c.execute(
        f"SELECT {cols} FROM items INDEXED BY items_live_id WHERE coll_id = ? AND deleted = 0 "
        "AND chunk = 0 AND item_id IN (SELECT value FROM json_each(?))",
        (coll_id, json.dumps(list(ids))),
    ).fetchall()


def live_among(c: Conn, coll_id: int, ids: Sequence[str]) -> set[str]:
    """Those of `ids` that are live items of the collection."""
    rows = c.execute(
        "SELECT item_id FROM items INDEXED BY items_live_id WHERE coll_id = ? AND deleted = 0 "
        "AND chunk = 0 AND item_id IN (SELECT value FROM json_each(?))",
        (coll_id, json.dumps(list(ids))),
    ).fetchall()
    return {r[0] for r in rows}


def items_page(c: Conn, coll_id: int, after: int, limit: int) -> list[tuple[Any, ...]]:
    """(seq, item_id, vector of chunk 0, whole text, metadata JSON) of live items after
    `after`, in seq order."""
    return c.execute(
        f"SELECT seq, item_id, vector, {_WHOLE}, metadata FROM items "
        "WHERE coll_id = ? AND deleted = 0 AND chunk = 0 AND seq > ? ORDER BY seq LIMIT ?",
        (coll_id, after, limit),
    ).fetchall()


def page_by(
    c: Conn, coll_id: int, path: str, after: tuple[Any, str] | None, limit: int,
    where: str, args: Sequence[Any],
) -> list[tuple[Any, ...]]:
    """(item_id, text, metadata JSON) of up to `limit` live rows matching `where`, ordered by
    the metadata value at JSON `path`, then id, starting after `after` = (value, id)."""
    key = "json_extract(metadata, ?)"
    sql = (
        f"SELECT item_id, {_WHOLE}, metadata FROM items "
        f"WHERE coll_id = ? AND deleted = 0 AND chunk = 0 AND ({where})"
    )
    params: list[Any] = [coll_id, *args]
    if after is not None:
        sql += f" AND ({key} > ? OR ({key} = ? AND item_id > ?))"
        params += [path, after[0], path, after[0], after[1]]
    sql += f" ORDER BY {key}, item_id LIMIT ?"
    params += [path, limit]
    return c.execute(sql, params).fetchall()


def matching_seqs(c: Conn, coll_id: int, where: str, args: Sequence[Any]) -> np.ndarray:
    rows = c.execute(
        f"SELECT seq FROM items WHERE coll_id = ? AND deleted = 0 AND ({where})",
        [coll_id, *args],
    ).fetchall()
    return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))


def texts_of(c: Conn, seqs: Sequence[int]) -> Iterator[tuple[int, str, str]]:
    """(seq, text, metadata JSON) of `seqs`: the text embedded (the chunk's)."""
    yield from c.execute(
        "SELECT seq, text, metadata FROM items WHERE seq IN (SELECT value FROM json_each(?))",
        (json.dumps(list(seqs)),),
    )


def hit_rows(c: Conn, seqs: Sequence[int], whole: bool) -> Iterator[tuple[Any, ...]]:
    """(seq, chunk, c_start, c_end, chunk text, metadata JSON, the item's whole text or '')
    of `seqs`; the whole text only when asked for (it may be megabytes), and '' when the
    item was replaced or deleted since."""
    full = (
        "COALESCE((SELECT COALESCE(t.text, h.text) FROM items h INDEXED BY items_live_id "
        "LEFT JOIN item_text t ON t.seq = h.seq WHERE h.coll_id = i.coll_id "
        "AND h.item_id = i.item_id AND h.chunk = 0 AND h.deleted = 0), '')"
        if whole else "''"
    )
    yield from c.execute(
        f"SELECT i.seq, i.chunk, i.c_start, i.c_end, i.text, i.metadata, {full} FROM items i "
        "WHERE i.seq IN (SELECT value FROM json_each(?))",
        (json.dumps(list(seqs)),),
    )


def item_seqs(c: Conn, coll_id: int, ids: Sequence[str]) -> list[tuple[int, str]]:
    """(seq, item id) of every live chunk of the items `ids`."""
    return c.execute(
        "SELECT seq, item_id FROM items INDEXED BY items_live_id WHERE coll_id = ? "
        "AND deleted = 0 AND item_id IN (SELECT value FROM json_each(?))",
        (coll_id, json.dumps(list(ids))),
    ).fetchall()
