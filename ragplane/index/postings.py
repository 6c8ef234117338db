"""A collection's lexical index held in memory, scored exactly as FTS5's bm25() scores it.

The FTS5 table (`ragplane.index.lexical`) stays the durable index, written in the items'
transaction. What it cannot do fast is score many rows: bm25() costs about 2.5 us a row,
and a query over a chunked collection holds a word of most of its chunks (5,446 of 7,698
in BENCHMARKS.md section 13). So a lexical search reads its postings from here instead:
per token, every instance's row and position, in numpy arrays, built from the FTS5 table's
own instances (`fts5vocab`) and the same tokenizer, never from a second tokenizer that
could disagree. Scoring a query is a handful of array operations per word.

The arrays are *segments*, as in Lucene: the first holds every row of the collection when
it was read; each later one the rows committed since (`Coll.indexed_seq` moves on), read
by the next search; segments merge, leaving deleted rows out, once there are too many.
Rows are never changed in place (an upsert writes a new row with a higher sequence number
and tombstones the old one), so a segment is immutable and deletions are read from the
collection's live set (`Coll.live`) when a query is scored. A search therefore sees the
collection as of the newest row its postings hold: BM25's statistics (rows, average
length, each word's row count) are counted over the live rows up to that row, as FTS5
counts them over its own.

A collection with more than MAX_INSTANCES token instances (FTS5's own count) is searched
through FTS5 (exact, slower), and so is one whose postings are being read in the background
(the first search of a collection of more than INLINE_INSTANCES, or after a large write).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ragplane.core import cpus
from ragplane.core.sqlite import connect
from ragplane.index import lexical
from ragplane.index.state import Coll

if TYPE_CHECKING:
    from ragplane.index.context import Context

log = logging.getLogger(__name__)

# FTS5's bm25() constants (fts5_aux.c) and its floor for a word in half the rows or more.
K1 = 1.2
B = 0.75
IDF_FLOOR = 1e-6

# Token instances held in memory at most per collection: 8 bytes each (row and position),
# so about 256 MiB. Larger collections are searched through FTS5.
MAX_INSTANCES = 32_000_000
# A search reads at most about this many token instances into the postings itself (about
# 0.3 s); more are read in the background while searches use FTS5.
INLINE_INSTANCES = 200_000
# Segments merge (deleted rows left out) once there are more than this many.
MAX_SEGMENTS = 8

Conn = sqlite3.Connection


@dataclass(frozen=True, eq=False)
class Segment:
    """The postings of some rows: `seqs` (ascending) are the rows holding a token, `dl` each
    row's token count; `span[token]` = (start, end) into `rows`/`pos`, every instance of the
    token ordered by row, then position."""

    seqs: np.ndarray  # int64
    dl: np.ndarray  # float64
    rows: np.ndarray  # int32 index into seqs
    pos: np.ndarray  # int32 token position in the row
    span: dict[str, tuple[int, int]]

    @property
    def instances(self) -> int:
        return int(self.rows.size)


def _empty() -> Segment:
    return Segment(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int32),
                   np.zeros(0, np.int32), {})


# The instances of an fts5vocab 'instance' table in one row: distinct tokens (separated by
# spaces: unicode61 splits on every space and punctuation mark, so no token holds one),
# their instance counts, and every instance's row and position, token by token.
_INSTANCES_SQL = (
    "SELECT group_concat(term, ' '), group_concat(n), group_concat(docs), group_concat(offs) "
    "FROM (SELECT term, count(*) AS n, group_concat(doc) AS docs, group_concat(offset) AS offs "
    "FROM {vocab} {where} GROUP BY term)"
)


def _read(c: Conn, vocab: str, where: str = "", args: Sequence[int] = ()) -> Segment:
    terms, counts, docs, offs = c.execute(
        _INSTANCES_SQL.format(vocab=vocab, where=where), args).fetchone()
    if not terms:
        return _empty()
    names = terms.split(" ")
    n = np.fromstring(counts, dtype=np.int64, sep=",")
    doc = np.fromstring(docs, dtype=np.int64, sep=",")
    pos = np.fromstring(offs, dtype=np.int32, sep=",")
    if not _ordered(n, doc, pos):  # fts5vocab yields each token's by row, then position
        token = np.repeat(np.arange(len(names), dtype=np.int64), n)
        order = np.lexsort((pos, doc, token))
        doc, pos = doc[order], pos[order]
    seqs, rows = np.unique(doc, return_inverse=True)
    ends = np.cumsum(n)
    span = dict(zip(names, zip((ends - n).tolist(), ends.tolist(), strict=True), strict=True))
    dl = np.bincount(rows, minlength=seqs.size).astype(np.float64)
    return Segment(seqs, dl, rows.astype(np.int32), pos, span)


def _ordered(n: np.ndarray, doc: np.ndarray, pos: np.ndarray) -> bool:
    """Whether each token's instances (`n` per token, in turn) are ordered by row, then
    position."""
    if doc.size < 2:
        return True
    later = (doc[1:] > doc[:-1]) | ((doc[1:] == doc[:-1]) & (pos[1:] > pos[:-1]))
    later[np.cumsum(n)[:-1] - 1] = True  # a new token starts anywhere
    return bool(later.all())


def _merge(parts: Sequence[Segment], keep: Sequence[np.ndarray]) -> Segment:
    """One segment of `parts` (ascending, disjoint seqs), keeping the rows `keep` marks."""
    seqs = np.concatenate([p.seqs[k] for p, k in zip(parts, keep, strict=True)])
    dl = np.concatenate([p.dl[k] for p, k in zip(parts, keep, strict=True)])
    names = sorted({t for p in parts for t in p.span})
    rows_out, pos_out, span = [], [], {}
    base, at = 0, 0
    new_row = []
    for p, k in zip(parts, keep, strict=True):
        m = np.full(p.seqs.size, -1, np.int64)
        m[k] = base + np.arange(int(k.sum()))
        new_row.append(m)
        base += int(k.sum())
    for t in names:
        start = at
        for p, m in zip(parts, new_row, strict=True):
            s = p.span.get(t)
            if s is None:
                continue
            r = m[p.rows[s[0]:s[1]]]
            ok = r >= 0
            rows_out.append(r[ok].astype(np.int32))
            pos_out.append(p.pos[s[0]:s[1]][ok])
            at += int(ok.sum())
        if at > start:
            span[t] = (start, at)
    if not rows_out:
        return _empty()
    return Segment(seqs, dl, np.concatenate(rows_out), np.concatenate(pos_out), span)


class _Tokens:
    """Query words -> their tokens (`lexical.tokens`), cached."""

    MAX = 50_000

    def __init__(self) -> None:
        self._cache: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def of(self, c: Conn, coll_id: int, words: Sequence[str]) -> list[tuple[str, ...]]:
        with self._lock:
            missing = [w for w in words if w not in self._cache]
        if missing:
            found = lexical.tokens(c, coll_id, missing)
            with self._lock:
                if len(self._cache) + len(missing) > self.MAX:
                    self._cache.clear()
                self._cache.update(zip(missing, found, strict=True))
        with self._lock:
            return [self._cache.get(w, ()) for w in words]


TOKENS = _Tokens()


@dataclass(frozen=True, eq=False)
class Scores:
    """Every matching row's BM25 score: `seqs` ascending, `values` aligned."""

    seqs: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return int(self.seqs.size)

    @classmethod
    def of_dict(cls, scores: dict[int, float]) -> Scores:
        seqs = np.fromiter(scores.keys(), np.int64, len(scores))
        values = np.fromiter(scores.values(), np.float64, len(scores))
        order = np.argsort(seqs, kind="stable")
        return cls(seqs[order], values[order])

    def restrict(self, allowed: np.ndarray) -> Scores:
        """Only the rows in `allowed` (seqs, any order): a metadata filter's matches."""
        keep = np.isin(self.seqs, allowed)
        return Scores(self.seqs[keep], self.values[keep])

    def of(self, seqs: Sequence[int]) -> dict[int, float]:
        """The scores of those of `seqs` that match."""
        q = np.asarray(seqs, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.seqs, q), max(0, self.seqs.size - 1))
        hit = self.seqs[at] == q if self.seqs.size else np.zeros(q.size, bool)
        return dict(zip(q[hit].tolist(), self.values[at[hit]].tolist(), strict=True))

    def top(self, id_of: Callable[[int], str | None], limit: int
            ) -> list[tuple[int, str, float]]:
        """The best `limit` rows as (seq, item id, score), best first, ties by item id;
        rows `id_of` no longer knows (deleted since) are left out."""
        v = self.values
        if limit < v.size:
            cut = np.partition(v, v.size - limit)[v.size - limit]  # the limit-th best
            pick = np.flatnonzero(v >= cut)
        else:
            pick = np.arange(v.size)
        rows = []
        for seq, s in zip(self.seqs[pick].tolist(), v[pick].tolist(), strict=True):
            item = id_of(seq)
            if item is not None:
                rows.append((seq, item, s))
        rows.sort(key=lambda r: (-r[2], r[1]))
        return rows[:limit]


EMPTY = Scores(np.zeros(0, np.int64), np.zeros(0))


@dataclass
class _View:
    """The live rows of each segment, and BM25's collection statistics over them."""

    key: tuple[int, int, int]
    masks: list[np.ndarray]
    n_rows: int
    avgdl: float


class Postings:
    """One collection's postings. Thread-safe: searches score immutable segments; one
    thread at a time reads new rows into them."""

    def __init__(self) -> None:
        # the segments, and the row up to which every committed row is in one (or was
        # deleted): replaced together, so a search reads a matching pair
        self.state: tuple[list[Segment], int] = ([], -1)
        self.too_big = False
        self.reading = False  # a background read is under way
        self._lock = threading.Lock()
        self._view: _View | None = None

    @property
    def upto(self) -> int:
        return self.state[1]

    @property
    def instances(self) -> int:
        return sum(s.instances for s in self.state[0])

    def ready(self, ctx: Context, coll: Coll) -> bool:
        """Bring the postings up to the collection's newest indexed row: inline when few
        rows are new, in the background otherwise (False until done, as when too big)."""
        target = coll.indexed_seq
        if self.reading:
            return False
        if self.upto >= target:
            return True
        rows, instances = lexical.size(ctx.reader(), coll.id)
        if instances > MAX_INSTANCES:
            if not self.too_big:
                self.too_big, self.state = True, ([], -1)  # the memory back
                log.info("collection %r holds %d token instances, over %d: its lexical searches "
                         "use FTS5", coll.name, instances, MAX_INSTANCES)
            return False
        self.too_big = False
        # new rows' instances, at the collection's mean per row (seqs count every collection's)
        new = instances if self.upto < 0 else (target - self.upto) * instances // max(1, rows)
        if new > INLINE_INSTANCES:
            with self._lock:
                if not self.reading:
                    self.reading = True
                    reader = threading.Thread(target=self._read_in_background,
                                              args=(ctx, coll), name=f"postings-{coll.id}",
                                              daemon=True)  # fmt: skip
                    with cpus.wide():  # not on the request core (ragplane.core.cpus)
                        reader.start()
            return False
        with self._lock:
            self._catch_up(ctx.reader(), coll, target)
        return not self.too_big

    def _read_in_background(self, ctx: Context, coll: Coll) -> None:
        try:
            conn = connect(ctx.db_path)
            try:
                with self._lock:
                    self._catch_up(conn, coll, coll.indexed_seq)
            finally:
                conn.close()
        except Exception:  # searches use FTS5 meanwhile; the next one tries again
            if not (coll.dropped or ctx.closed):
                log.exception("reading the lexical postings of %r failed", coll.name)
        finally:
            self.reading = False

    def _catch_up(self, c: Conn, coll: Coll, target: int) -> None:
        """Read the rows after `upto` up to `target` into a new segment. Under _lock."""
        if self.upto >= target:
            return
        if self.upto < 0:
            lexical.temp_tables(c, coll.id)
            seg = _read(c, f"temp.{lexical.table(coll.id)}_inst", "WHERE doc <= ?", (target,))
        else:
            seg = _tokenized(c, coll.id, self.upto, target)
        segments = [*self.state[0], seg] if seg.seqs.size else list(self.state[0])
        if sum(s.instances for s in segments) > MAX_INSTANCES:
            self.too_big, self.state = True, ([], -1)
            log.info("collection %r holds over %d token instances: its lexical searches use "
                     "FTS5", coll.name, MAX_INSTANCES)
            return
        if len(segments) > MAX_SEGMENTS:
            with coll.rw.read():
                keep = [coll.live.contains(s.seqs) for s in segments]
            segments = [_merge(segments, keep)]
        self.state = (segments, target)

    def view(self, coll: Coll) -> tuple[list[Segment], _View]:
        """The segments and their live rows now. Called once `ready`."""
        segments, upto = self.state
        with coll.rw.read():
            key = (coll.version, coll.live_count, upto)
            view = self._view
            if view is not None and view.key == key and len(view.masks) == len(segments):
                return segments, view
            masks = [coll.live.contains(s.seqs) for s in segments]
            bits = coll.live.bits
            first = (upto + 1) >> 3  # live rows past `upto` are not in the postings yet
            later = np.unpackbits(bits[first:], bitorder="little")[(upto + 1) - 8 * first:]
            n_rows = coll.live_count - int(later.sum())
        tokens = sum(float(s.dl[m].sum()) for s, m in zip(segments, masks, strict=True))
        view = _View(key, masks, n_rows, tokens / n_rows if n_rows else 0.0)
        self._view = view
        return segments, view


def _tokenized(c: Conn, coll_id: int, after: int, upto: int) -> Segment:
    """A segment of the live rows after `after` up to `upto`, tokenised by the scratch
    table (their instances cannot be read alone from the collection's table)."""
    lexical.temp_tables(c, coll_id)
    c.execute(
        "INSERT INTO temp.lex_tok (rowid, text) SELECT seq, text FROM items "
        "WHERE coll_id = ? AND seq > ? AND seq <= ? AND deleted = 0", (coll_id, after, upto))
    try:
        return _read(c, "temp.lex_tokens")
    finally:
        c.execute("INSERT INTO temp.lex_tok (lex_tok) VALUES ('delete-all')")


_registry: weakref.WeakKeyDictionary[Coll, Postings] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def of(coll: Coll) -> Postings:
    with _registry_lock:
        p = _registry.get(coll)
        if p is None:
            p = _registry[coll] = Postings()
        return p


def _phrase_rows(seg: Segment, live: np.ndarray, tokens: tuple[str, ...]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The live rows of `seg` holding the phrase `tokens`, and how many times each does."""
    spans = [seg.span.get(t) for t in tokens]
    if any(s is None for s in spans):
        return np.zeros(0, np.int64), np.zeros(0)
    if len(tokens) == 1:
        s, e = spans[0]  # type: ignore[misc]
        rows = seg.rows[s:e]
    else:  # rows and start positions where every token follows the one before
        keys = None
        for j, (s, e) in enumerate(spans):  # type: ignore[misc]
            p = seg.pos[s:e].astype(np.int64) - j
            ok = p >= 0
            k = (seg.rows[s:e][ok].astype(np.int64) << 32) | p[ok]
            keys = k if keys is None else np.intersect1d(keys, k, assume_unique=True)
        rows = (keys >> 32) if keys is not None else np.zeros(0, np.int64)
    rows = rows[live[rows]]
    if not rows.size:
        return np.zeros(0, np.int64), np.zeros(0)
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    counts = np.diff(np.append(starts, rows.size))
    return rows[starts].astype(np.int64), counts.astype(np.float64)


def _rows_holding(segments: Sequence[Segment], view: _View, token: str) -> int:
    return sum(int(_phrase_rows(s, m, (token,))[0].size)
               for s, m in zip(segments, view.masks, strict=True))


def score(segments: Sequence[Segment], view: _View, terms: Sequence[str],
          phrases: Sequence[tuple[str, ...]]) -> Scores:
    """BM25 of every live row holding a phrase of the query, as FTS5's bm25() computes it
    for the expression `"t1" OR "t2" ...` (`phrases`: each term's tokens): each term's idf
    from the live rows holding it, floored at IDF_FLOOR, and the terms that half the rows
    or more hold left out as `lexical.weightless` leaves them (unless that leaves none)."""
    found = [[_phrase_rows(s, m, p) for s, m in zip(segments, view.masks, strict=True)]
             for p in phrases]
    hits = [sum(int(r.size) for r, _ in f) for f in found]
    n = view.n_rows
    use = list(range(len(terms)))
    if n > 0:  # lexical.weightless's words: one token (maybe repeated), in half the rows
        common = {i for i, p in enumerate(phrases) if len(set(p)) == 1 and 2 * (
            hits[i] if len(p) == 1 else _rows_holding(segments, view, p[0])) >= n}
        use = [i for i in use if i not in common] or use
    out_seqs, out_values = [], []
    for si, seg in enumerate(segments):
        acc = np.zeros(seg.seqs.size)
        hit = np.zeros(seg.seqs.size, bool)
        for i in use:
            rows, tf = found[i][si]
            if not rows.size:
                continue
            idf = math.log((n - hits[i] + 0.5) / (hits[i] + 0.5))
            if idf <= 0.0:
                idf = IDF_FLOOR
            d = seg.dl[rows]
            acc[rows] += idf * ((tf * (K1 + 1.0)) / (tf + K1 * (1 - B + B * d / view.avgdl)))
            hit[rows] = True
        out_seqs.append(seg.seqs[hit])
        out_values.append(acc[hit])
    if not out_seqs:
        return EMPTY
    return Scores(np.concatenate(out_seqs), np.concatenate(out_values))
