"""Shadow evidence and flips, persisted in the server's own database (`TABLES`, opened by
the store the server runs on): SQLite (data_dir/shadow.db), or a shared store's tables,
where every server of the cluster records its samples and reads everyone's, and where a
flip is the cluster's (`set_serving` is a compare-and-set on the case's row).

Evidence is kept per case-of-use, shadow release (name@version), canonical (name@version),
hardware class, phase (`shadow` before a flip, `watch` while the shadow serves) and traffic
class (server.shadow.classes):
  * every offered batch: compared (count, min and sum of cosines, and the smallest MAX_LOW
    cosines, so the 1st percentile is exact while the count is at most 100 x MAX_LOW), or
    failed (an error: the shadow raised, or gave NaN, infinite, misshapen or miscounted
    vectors), or dropped (the queue was full), or skipped (the server was busy and the
    minimum share under load did not take it); of the compared and failed, how many were
    taken while the server was busy;
  * observed time: the gaps between consecutive sampled batches of a release, each counted
    only when at most ACTIVE_GAP_S on this process's monotonic clock, so ten minutes of
    traffic and one batch a day later are ten minutes, not a day;
  * every timed batch: its three times and their order (canonical, shadow, canonical or
    shadow, canonical, shadow), the latest MAX_TIMINGS per class, for
    server.shadow.timing's estimator;
  * overlap@10 of the probe set (the latest measurement).
Evidence is always shadow-vs-canonical as declared, whichever of the two is serving, and a
release's record is permanent: no flip or unflip deletes it, so a watch that failed stays
on the release's record (server.shadow.status.barred_releases) across restarts. The gates that read
it live in server.shadow.gates. A data directory from before per-class evidence keeps its
old `evidence` table, which nothing reads any more.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ragplane.core.errors import RagplaneError
from ragplane.core.serverdb import Execute, ServerDb, SqliteServerDb, Tables
from ragplane.server.shadow.classes import NAMES
from ragplane.server.shadow.timing import Timing
from ragplane.server.shadow.types import FlipEvent

_KEY = (
    "use_case TEXT NOT NULL, release TEXT NOT NULL, canonical TEXT NOT NULL, "
    "hardware TEXT NOT NULL, phase TEXT NOT NULL"
)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS class_evidence (
  {_KEY}, class TEXT NOT NULL,
  batches INTEGER NOT NULL DEFAULT 0, samples INTEGER NOT NULL DEFAULT 0,
  cos_min REAL NOT NULL DEFAULT 1.0, cos_sum REAL NOT NULL DEFAULT 0.0,
  low TEXT NOT NULL DEFAULT '[]', errors INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NOT NULL DEFAULT '', dropped INTEGER NOT NULL DEFAULT 0,
  first_at REAL NOT NULL, updated_at REAL NOT NULL,
  skipped INTEGER NOT NULL DEFAULT 0, busy INTEGER NOT NULL DEFAULT 0,
  active_s REAL NOT NULL DEFAULT 0.0,
  PRIMARY KEY (use_case, release, canonical, hardware, phase, class));
CREATE TABLE IF NOT EXISTS batch_timings (
  {_KEY}, class TEXT NOT NULL, at REAL NOT NULL,
  t1 REAL NOT NULL, t2 REAL NOT NULL, t3 REAL NOT NULL, shadow_first INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS batch_timings_key ON batch_timings (use_case, release, phase, class);
CREATE TABLE IF NOT EXISTS overlap (
  {_KEY}, overlap REAL NOT NULL, probes INTEGER NOT NULL, updated_at REAL NOT NULL,
  PRIMARY KEY (use_case, release, canonical, hardware, phase));
CREATE TABLE IF NOT EXISTS case_state (
  use_case TEXT PRIMARY KEY, serving TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS history (
  use_case TEXT NOT NULL, at REAL NOT NULL, action TEXT NOT NULL, serving TEXT NOT NULL,
  forced INTEGER NOT NULL, reason TEXT NOT NULL);
"""
_SQLITE_TABLES = {
    "evidence": "class_evidence", "timings": "batch_timings", "overlap": "overlap",
    "state": "case_state", "history": "history", "seq": "rowid",
}  # fmt: skip
_COLS = "use_case, release, canonical, hardware, phase"
log = logging.getLogger(__name__)
MAX_LOW = 5_000
MAX_TIMINGS = 10_000  # per key and class: the estimator reads the latest this many
PHASES = ("shadow", "watch")
# the longest gap between two sampled batches of a release that counts as observed time
ACTIVE_GAP_S = 300.0
# columns a data directory from before them lacks (SQLite: added at open)
_ADDED = {"skipped": "INTEGER NOT NULL DEFAULT 0", "busy": "INTEGER NOT NULL DEFAULT 0",
          "active_s": "REAL NOT NULL DEFAULT 0.0"}  # fmt: skip
TABLES = Tables("shadow.db", _SQLITE_TABLES, _SCHEMA, {"evidence": _ADDED})


@dataclass(frozen=True)
class EvidenceKey:
    use_case: str
    release: str  # the shadow's name@version
    canonical: str  # the canonical's name@version
    hardware: str  # server.shadow.hardware
    phase: str = "shadow"

    def row(self) -> tuple[str, str, str, str, str]:
        return (self.use_case, self.release, self.canonical, self.hardware, self.phase)


@dataclass(frozen=True)
class ClassRow:
    """What the store holds for one key and class."""

    batches: int
    samples: int
    cos_min: float
    cos_sum: float
    low: list[float]
    errors: int
    last_error: str
    dropped: int
    first_at: float
    updated_at: float
    timings: list[Timing]
    skipped: int = 0  # offered while busy, not sampled
    busy: int = 0  # sampled (compared or failed) while busy
    active_s: float = 0.0  # observed time credited to this class


@dataclass(frozen=True)
class StoredRelease:
    """Every class of one key, and its overlap@10, as stored."""

    key: EvidenceKey
    classes: dict[str, ClassRow]
    overlap: float
    probes: int


class EvidenceStore:
    def __init__(self, path: Path | None = None, *, db: ServerDb | None = None) -> None:
        """`db`: `TABLES` opened by the server's store; `path`: that SQLite file."""
        if db is None:
            assert path is not None, "EvidenceStore needs a path or a db"
            db = SqliteServerDb(path, TABLES)
        self._db = db
        # counts made on the request path (skips; a shared store's drops), not yet written:
        # (key, class, column) -> n
        self._pending: Counter[tuple[EvidenceKey, str, str]] = Counter()
        self._pending_lock = threading.Lock()
        # per release (key): when its latest sample was recorded, on the monotonic clock
        self._last_seen: dict[EvidenceKey, float] = {}

    @property
    def shared(self) -> bool:
        """Other servers record and flip in the same tables."""
        return self._db.shared

    @contextmanager
    def _writing(self) -> Iterator[Execute]:
        """One write transaction; a full or read-only data directory raises StorageFull /
        StorageReadOnly, an unreachable PostgreSQL Unavailable (the shadow worker counts
        the sample as dropped and goes on). Drops counted since the last write go first."""
        self.flush()
        with self._db.write() as execute:
            yield execute

    def flush(self) -> None:
        """Write the drops counted in memory (a shared store's, see `record_drop`); on
        failure they stay counted, for the next try."""
        with self._pending_lock:
            pending, self._pending = self._pending, Counter()
        if not pending:
            return
        try:
            # rows in one order on every server: two flushes never wait on each other
            order = sorted(pending, key=lambda kc: (*kc[0].row(), kc[1], kc[2]))
            with self._db.write() as execute:
                for key, cls, column in order:
                    self._add_count(execute, key, cls, column, pending[(key, cls, column)])
        except BaseException:
            with self._pending_lock:
                self._pending.update(pending)
            raise

    def close(self) -> None:
        try:
            self.flush()
        except RagplaneError as exc:
            log.warning("%d dropped samples were not counted: %s", sum(self._pending.values()), exc)
        self._db.close()

    @staticmethod
    def _ensure(execute: Execute, key: EvidenceKey, cls: str) -> None:
        now = time.time()
        execute(
            f"INSERT INTO {{evidence}} ({_COLS}, class, first_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (*key.row(), cls, now, now),
        )

    _WHERE = "use_case = ? AND release = ? AND canonical = ? AND hardware = ? AND phase = ?"

    def _active(self, key: EvidenceKey) -> float:
        """Observed seconds to credit a sample of `key` recorded now: the gap since the
        previous sample of the same release and phase on this process, when at most
        ACTIVE_GAP_S. Under the lock: the worker records here, and so does a request
        whose served batch was refused (`ShadowManager.serving_failed`)."""
        now = time.monotonic()
        with self._pending_lock:
            last = self._last_seen.get(key)
            self._last_seen[key] = now
        return now - last if last is not None and now - last <= ACTIVE_GAP_S else 0.0

    def _sampled(self, execute: Execute, key: EvidenceKey, cls: str, busy: bool) -> None:
        """The counts every sampled batch adds: busy, observed time."""
        execute(
            "UPDATE {evidence} SET busy = busy + ?, active_s = active_s + ? "
            f"WHERE {self._WHERE} AND class = ?",
            (int(busy), self._active(key), *key.row(), cls),
        )

    def record_agreement(
        self, key: EvidenceKey, cls: str, cosines: Sequence[float], *, busy: bool = False
    ) -> None:
        """One compared batch of `cls`: its per-vector cosines, every one finite (the
        manager turns a non-finite output into an error before it gets here); `busy`:
        sampled while requests were waiting."""
        values = [float(c) for c in cosines]
        if not values or not all(math.isfinite(c) for c in values):
            raise ValueError("record_agreement takes finite cosines only; record an error")
        with self._writing() as execute:
            self._ensure(execute, key, cls)
            self._sampled(execute, key, cls, busy)
            n, low = execute(
                f"SELECT samples, low FROM {{evidence}} WHERE {self._WHERE} AND class = ? "
                "{for_update}",
                (*key.row(), cls),
            ).fetchone()
            merged = sorted([*json.loads(low), *values])[:MAX_LOW]
            lowest = min(values)
            execute(
                "UPDATE {evidence} SET batches = batches + 1, samples = ?, cos_min = CASE "
                "WHEN cos_min < ? THEN cos_min ELSE ? END, cos_sum = cos_sum + ?, low = ?, "
                f"updated_at = ? WHERE {self._WHERE} AND class = ?",
                (n + len(values), lowest, lowest, sum(values), json.dumps(merged),
                 time.time(), *key.row(), cls),
            )  # fmt: skip

    def record_error(self, key: EvidenceKey, cls: str, what: str, *, busy: bool = False) -> None:
        """One sampled batch of `cls` whose shadow output could not be compared (or, in
        the watch, a served batch the serving path refused)."""
        with self._writing() as execute:
            self._ensure(execute, key, cls)
            self._sampled(execute, key, cls, busy)
            execute(
                "UPDATE {evidence} SET batches = batches + 1, errors = errors + 1, "
                f"last_error = ?, updated_at = ? WHERE {self._WHERE} AND class = ?",
                (what[:500], time.time(), *key.row(), cls),
            )

    def record_drop(self, key: EvidenceKey, cls: str) -> None:
        """One sample of `cls` dropped (the queue was full: called on the request path).
        A shared store counts it in memory, written with the next write or read here:
        a request must not wait on PostgreSQL for the shadow's sake."""
        if self._db.shared:
            with self._pending_lock:
                self._pending[(key, cls, "dropped")] += 1
            return
        with self._writing() as execute:
            self._add_count(execute, key, cls, "dropped", 1)

    def record_skip(self, key: EvidenceKey, cls: str) -> None:
        """One batch of `cls` offered while the server was busy and not sampled (called
        on the request path, under load: counted in memory, written with the next write
        or read)."""
        with self._pending_lock:
            self._pending[(key, cls, "skipped")] += 1

    def _add_count(self, execute: Execute, key: EvidenceKey, cls: str, column: str, n: int) -> None:
        assert column in ("dropped", "skipped"), column
        self._ensure(execute, key, cls)
        execute(
            f"UPDATE {{evidence}} SET {column} = {column} + ?, updated_at = ? "
            f"WHERE {self._WHERE} AND class = ?",
            (n, time.time(), *key.row(), cls),
        )

    def record_timing(
        self, key: EvidenceKey, cls: str, t1: float, t2: float, t3: float, shadow_first: bool
    ) -> None:
        """One timed batch of `cls`: its three runs' seconds, in the order they ran
        (shadow, canonical, shadow when `shadow_first`, else canonical, shadow, canonical)."""
        with self._writing() as execute:
            self._ensure(execute, key, cls)
            (seq,) = execute(
                f"INSERT INTO {{timings}} ({_COLS}, class, at, t1, t2, t3, shadow_first) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {seq}",
                (*key.row(), cls, time.time(), t1, t2, t3, int(shadow_first)),
            ).fetchone()
            if (seq or 0) % 1000 == 0:
                execute(
                    f"DELETE FROM {{timings}} WHERE {self._WHERE} AND class = ? AND {{seq}} "
                    f"NOT IN (SELECT {{seq}} FROM {{timings}} WHERE {self._WHERE} AND "
                    "class = ? ORDER BY {seq} DESC LIMIT ?)",
                    (*key.row(), cls, *key.row(), cls, MAX_TIMINGS),
                )

    def record_overlap(self, key: EvidenceKey, overlap: float, probes: int) -> None:
        with self._writing() as execute:
            execute(
                f"INSERT INTO {{overlap}} ({_COLS}, overlap, probes, updated_at) VALUES "
                f"(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT ({_COLS}) DO UPDATE SET "
                "overlap = excluded.overlap, probes = excluded.probes, "
                "updated_at = excluded.updated_at",
                (*key.row(), overlap, probes, time.time()),
            )

    # -- reading -------------------------------------------------------------------------

    def stored(self, use_case: str, phase: str = "shadow") -> list[StoredRelease]:
        """Every (release, canonical, hardware) of `use_case` in `phase`, oldest first."""
        self.flush()
        where = (use_case, phase)
        rows = self._db.read(
            "SELECT release, canonical, hardware, class, batches, samples, cos_min, cos_sum, "
            "low, errors, last_error, dropped, first_at, updated_at, skipped, busy, active_s "
            "FROM {evidence} "
            "WHERE use_case = ? AND phase = ? ORDER BY first_at",
            where,
        )
        timings: dict[tuple, list[Timing]] = defaultdict(list)
        for *k, t1, t2, t3, shadow_first in self._db.read(
            "SELECT release, canonical, hardware, class, t1, t2, t3, shadow_first FROM "
            "{timings} WHERE use_case = ? AND phase = ? ORDER BY {seq}",
            where,
        ):
            timings[tuple(k)].append((t1, t2, t3, bool(shadow_first)))
        overlaps = {
            tuple(k): (o, p)
            for *k, o, p in self._db.read(
                "SELECT release, canonical, hardware, overlap, probes FROM {overlap} "
                "WHERE use_case = ? AND phase = ?",
                where,
            )
        }
        out: dict[tuple, StoredRelease] = {}
        for release, canonical, hardware, cls, *nums in rows:
            k = (release, canonical, hardware)
            if k not in out:
                o, p = overlaps.get(k, (0.0, 0))
                key = EvidenceKey(use_case, release, canonical, hardware, phase)
                out[k] = StoredRelease(key, {}, o, p)
            batches, samples, cmin, csum, low, errors, last, dropped, first, updated = nums[:10]
            skipped, busy, active = nums[10:]
            out[k].classes[cls] = ClassRow(
                batches, samples, cmin, csum, json.loads(low), errors, last, dropped,
                first, updated, timings[(*k, cls)][-MAX_TIMINGS:], skipped, busy, active,
            )  # fmt: skip
        for s in out.values():  # classes in their declared order
            ordered = {c: s.classes[c] for c in NAMES if c in s.classes}
            s.classes.clear()
            s.classes.update(ordered)
        return list(out.values())

    def serving(self, case: str) -> str | None:
        rows = self._db.read("SELECT serving FROM {state} WHERE use_case = ?", (case,))
        return rows[0][0] if rows else None

    def state(self, case: str) -> tuple[str | None, bool]:
        """(the identity serving `case` as stored, or None; whether the flip in force was
        forced): one read, for a server that follows flips made by others."""
        serving = self.serving(case)
        last = self._db.read(
            "SELECT action, forced FROM {history} WHERE use_case = ? ORDER BY {seq} DESC LIMIT 1",
            (case,),
        )
        return serving, bool(last) and last[0][0] == "flip" and bool(last[0][1])

    def set_serving(
        self,
        case: str,
        serving: str,
        action: str,
        forced: bool,
        reason: str,
        *,
        expect: str | None = None,
    ) -> bool:
        """Record that `serving` now answers `case`, and why, in its history. With `expect`
        (what the caller believes serves now, stored as the case's first state if it has
        none), a compare-and-set: nothing changes, and False is returned, when another
        server changed it first. No evidence is touched: a release's record is kept."""
        now = time.time()
        with self._writing() as execute:
            if expect is None:
                execute(
                    "INSERT INTO {state} (use_case, serving, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (use_case) DO UPDATE SET serving = excluded.serving, "
                    "updated_at = excluded.updated_at",
                    (case, serving, now),
                )
            else:
                execute(
                    "INSERT INTO {state} (use_case, serving, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (case, expect, now),
                )
                cur = execute(
                    "UPDATE {state} SET serving = ?, updated_at = ? WHERE use_case = ? "
                    "AND serving = ?",
                    (serving, now, case, expect),
                )
                if cur.rowcount != 1:
                    return False
            execute(
                "INSERT INTO {history} (use_case, at, action, serving, forced, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (case, now, action, serving, int(forced), reason),
            )
        return True

    def history(self, case: str) -> list[FlipEvent]:
        rows = self._db.read(
            "SELECT at, action, serving, forced, reason FROM {history} WHERE use_case = ? "
            "ORDER BY {seq}",  # the order of the commits: servers' clocks may disagree
            (case,),
        )
        return [
            FlipEvent(at, action, serving, bool(forced), reason)
            for at, action, serving, forced, reason in rows
        ]
