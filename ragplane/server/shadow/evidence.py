"""Shadow evidence, persisted in SQLite (data_dir/shadow.db).

Evidence is kept per case-of-use, shadow release (name@version), canonical (name@version),
hardware class, phase (`shadow` before a flip, `watch` since the last one) and traffic
class (server.shadow.classes):
  * every sampled batch: compared (count, min and sum of cosines, and the smallest MAX_LOW
    cosines, so the 1st percentile is exact while the count is at most 100 x MAX_LOW), or
    failed (an error: the shadow raised, or gave NaN, infinite, misshapen or miscounted
    vectors), or dropped (the queue was full);
  * every timed batch: its three times and their order (canonical, shadow, canonical or
    shadow, canonical, shadow), the latest MAX_TIMINGS per class, for
    server.shadow.timing's estimator;
  * overlap@10 of the probe set (the latest measurement).
Evidence is always shadow-vs-canonical as declared, whichever of the two is serving. The
gates that read it live in server.shadow.gates. A data directory from before per-class
evidence keeps its old `evidence` table, which nothing reads any more.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ragplane.core.sqlite import connect, transaction
from ragplane.core.storage import storage_errors
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
MAX_LOW = 5_000
MAX_TIMINGS = 10_000  # per key and class: the estimator reads the latest this many
PHASES = ("shadow", "watch")


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


@dataclass(frozen=True)
class StoredRelease:
    """Every class of one key, and its overlap@10, as stored."""

    key: EvidenceKey
    classes: dict[str, ClassRow]
    overlap: float
    probes: int


class EvidenceStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(path)
        self._dir = path.parent
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Serialise a write; a full or read-only data directory raises StorageFull /
        StorageReadOnly (the shadow worker counts the sample as dropped and goes on)."""
        with self._lock, storage_errors(self._dir), transaction(self._db):
            yield

    def close(self) -> None:
        self._db.close()

    def _ensure(self, key: EvidenceKey, cls: str) -> None:
        now = time.time()
        self._db.execute(
            "INSERT OR IGNORE INTO class_evidence (use_case, release, canonical, hardware, "
            "phase, class, first_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (*key.row(), cls, now, now),
        )

    _WHERE = "use_case = ? AND release = ? AND canonical = ? AND hardware = ? AND phase = ?"

    def record_agreement(self, key: EvidenceKey, cls: str, cosines: Sequence[float]) -> None:
        """One compared batch of `cls`: its per-vector cosines, every one finite (the
        manager turns a non-finite output into an error before it gets here)."""
        values = [float(c) for c in cosines]
        if not values or not all(math.isfinite(c) for c in values):
            raise ValueError("record_agreement takes finite cosines only; record an error")
        with self._writing():
            self._ensure(key, cls)
            n, low = self._db.execute(
                f"SELECT samples, low FROM class_evidence WHERE {self._WHERE} AND class = ?",
                (*key.row(), cls),
            ).fetchone()
            merged = sorted([*json.loads(low), *values])[:MAX_LOW]
            self._db.execute(
                "UPDATE class_evidence SET batches = batches + 1, samples = ?, "
                "cos_min = MIN(cos_min, ?), cos_sum = cos_sum + ?, low = ?, updated_at = ? "
                f"WHERE {self._WHERE} AND class = ?",
                (
                    n + len(values),
                    min(values),
                    sum(values),
                    json.dumps(merged),
                    time.time(),
                    *key.row(),
                    cls,
                ),
            )

    def record_error(self, key: EvidenceKey, cls: str, what: str) -> None:
        """One sampled batch of `cls` whose shadow output could not be compared."""
        with self._writing():
            self._ensure(key, cls)
            self._db.execute(
                "UPDATE class_evidence SET batches = batches + 1, errors = errors + 1, "
                f"last_error = ?, updated_at = ? WHERE {self._WHERE} AND class = ?",
                (what[:500], time.time(), *key.row(), cls),
            )

    def record_drop(self, key: EvidenceKey, cls: str) -> None:
        with self._writing():
            self._ensure(key, cls)
            self._db.execute(
                "UPDATE class_evidence SET dropped = dropped + 1, updated_at = ? "
                f"WHERE {self._WHERE} AND class = ?",
                (time.time(), *key.row(), cls),
            )

    def record_timing(
        self, key: EvidenceKey, cls: str, t1: float, t2: float, t3: float, shadow_first: bool
    ) -> None:
        """One timed batch of `cls`: its three runs' seconds, in the order they ran
        (shadow, canonical, shadow when `shadow_first`, else canonical, shadow, canonical)."""
        with self._writing():
            self._ensure(key, cls)
            cur = self._db.execute(
                "INSERT INTO batch_timings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*key.row(), cls, time.time(), t1, t2, t3, int(shadow_first)),
            )
            if (cur.lastrowid or 0) % 1000 == 0:
                self._db.execute(
                    f"DELETE FROM batch_timings WHERE {self._WHERE} AND class = ? AND rowid "
                    f"NOT IN (SELECT rowid FROM batch_timings WHERE {self._WHERE} AND class = ? "
                    "ORDER BY rowid DESC LIMIT ?)",
                    (*key.row(), cls, *key.row(), cls, MAX_TIMINGS),
                )

    def record_overlap(self, key: EvidenceKey, overlap: float, probes: int) -> None:
        with self._writing():
            self._db.execute(
                "INSERT OR REPLACE INTO overlap VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*key.row(), overlap, probes, time.time()),
            )

    def clear(self, use_case: str, release: str, phase: str) -> None:
        """Forget `phase`'s evidence of a release (a new flip starts a new watch)."""
        with self._writing():
            for table in ("class_evidence", "batch_timings", "overlap"):
                self._db.execute(
                    f"DELETE FROM {table} WHERE use_case = ? AND release = ? AND phase = ?",
                    (use_case, release, phase),
                )

    # -- reading -------------------------------------------------------------------------

    def stored(self, use_case: str, phase: str = "shadow") -> list[StoredRelease]:
        """Every (release, canonical, hardware) of `use_case` in `phase`, oldest first."""
        rows = self._db.execute(
            "SELECT release, canonical, hardware, class, batches, samples, cos_min, cos_sum, "
            "low, errors, last_error, dropped, first_at, updated_at FROM class_evidence "
            "WHERE use_case = ? AND phase = ? ORDER BY first_at",
            (use_case, phase),
        ).fetchall()
        timings: dict[tuple, list[Timing]] = defaultdict(list)
        for *k, t1, t2, t3, shadow_first in self._db.execute(
            "SELECT release, canonical, hardware, class, t1, t2, t3, shadow_first FROM "
            "batch_timings WHERE use_case = ? AND phase = ? ORDER BY rowid",
            (use_case, phase),
        ):
            timings[tuple(k)].append((t1, t2, t3, bool(shadow_first)))
        overlaps = {
            tuple(k): (o, p)
            for *k, o, p in self._db.execute(
                "SELECT release, canonical, hardware, overlap, probes FROM overlap "
                "WHERE use_case = ? AND phase = ?",
                (use_case, phase),
            )
        }
        out: dict[tuple, StoredRelease] = {}
        for release, canonical, hardware, cls, *nums in rows:
            k = (release, canonical, hardware)
            if k not in out:
                o, p = overlaps.get(k, (0.0, 0))
                key = EvidenceKey(use_case, release, canonical, hardware, phase)
                out[k] = StoredRelease(key, {}, o, p)
            batches, samples, cmin, csum, low, errors, last, dropped, first, updated = nums
            out[k].classes[cls] = ClassRow(
                batches, samples, cmin, csum, json.loads(low), errors, last, dropped,
                first, updated, timings[(*k, cls)][-MAX_TIMINGS:],
            )  # fmt: skip
        for s in out.values():  # classes in their declared order
            ordered = {c: s.classes[c] for c in NAMES if c in s.classes}
            s.classes.clear()
            s.classes.update(ordered)
        return list(out.values())

    def serving(self, case: str) -> str | None:
        row = self._db.execute(
            "SELECT serving FROM case_state WHERE use_case = ?", (case,)
        ).fetchone()
        return row[0] if row else None

    def set_serving(self, case: str, serving: str, action: str, forced: bool, reason: str) -> None:
        now = time.time()
        with self._writing():
            self._db.execute(
                "INSERT OR REPLACE INTO case_state VALUES (?, ?, ?)", (case, serving, now)
            )
            self._db.execute(
                "INSERT INTO history VALUES (?, ?, ?, ?, ?, ?)",
                (case, now, action, serving, int(forced), reason),
            )

    def history(self, case: str) -> list[FlipEvent]:
        rows = self._db.execute(
            "SELECT at, action, serving, forced, reason FROM history WHERE use_case = ? "
            "ORDER BY at",
            (case,),
        ).fetchall()
        return [
            FlipEvent(at, action, serving, bool(forced), reason)
            for at, action, serving, forced, reason in rows
        ]
