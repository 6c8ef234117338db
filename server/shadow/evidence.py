"""Shadow evidence, persisted in SQLite (data_dir/shadow.db), and the gates G1-G3.

Per case-of-use and shadow release (name@version of the Rust embedder):
  * agreement: count, min and mean cosine, and the 1st percentile, exact while the count is
    at most 100 x MAX_LOW (the smallest MAX_LOW cosines are kept), a lower bound after;
  * overlap@10 of the probe set (latest measurement);
  * time: per timed batch, r = shadow / mean(canonical before, canonical after) on the same
    texts; the ratio is the geometric mean of r, its upper bound exp(mean + 1.645 sd / sqrt n)
    (one-sided 95%), beside the A/A ratio canonical-after / canonical-before (noise floor);
  * errors and dropped samples.
Evidence is always shadow-vs-canonical as declared, whichever of the two is serving.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from core.sqlite import connect, transaction
from core.storage import storage_errors
from server.shadow.config import Gates
from server.shadow.types import FlipEvent, GateResult, ReleaseEvidence

_SCHEMA = """
CREATE TABLE IF NOT EXISTS evidence (
  use_case TEXT NOT NULL, release TEXT NOT NULL,
  samples INTEGER NOT NULL DEFAULT 0, cos_min REAL NOT NULL DEFAULT 1.0,
  cos_sum REAL NOT NULL DEFAULT 0.0, low TEXT NOT NULL DEFAULT '[]',
  overlap REAL NOT NULL DEFAULT 0.0, probes INTEGER NOT NULL DEFAULT 0,
  timed INTEGER NOT NULL DEFAULT 0, lr_sum REAL NOT NULL DEFAULT 0.0,
  lr_sq REAL NOT NULL DEFAULT 0.0, aa_sum REAL NOT NULL DEFAULT 0.0,
  errors INTEGER NOT NULL DEFAULT 0, dropped INTEGER NOT NULL DEFAULT 0,
  first_at REAL NOT NULL, updated_at REAL NOT NULL,
  PRIMARY KEY (use_case, release));
CREATE TABLE IF NOT EXISTS case_state (
  use_case TEXT PRIMARY KEY, serving TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS history (
  use_case TEXT NOT NULL, at REAL NOT NULL, action TEXT NOT NULL, serving TEXT NOT NULL,
  forced INTEGER NOT NULL, reason TEXT NOT NULL);
"""
Z_95 = 1.6448536269514722  # one-sided 95%
MAX_LOW = 5_000


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
        StorageReadOnly (the shadow worker logs it and goes on with the next sample)."""
        with self._lock, storage_errors(self._dir):
            yield

    def close(self) -> None:
        self._db.close()

    def _ensure(self, case: str, release: str) -> None:
        now = time.time()
        self._db.execute(
            "INSERT OR IGNORE INTO evidence (use_case, release, first_at, updated_at) "
            "VALUES (?, ?, ?, ?)",
            (case, release, now, now),
        )

    def record_agreement(self, case: str, release: str, cosines: Sequence[float]) -> None:
        if not len(cosines):
            return
        with self._writing():
            self._ensure(case, release)
            n, low = self._db.execute(
                "SELECT samples, low FROM evidence WHERE use_case = ? AND release = ?",
                (case, release),
            ).fetchone()
            n += len(cosines)
            merged = sorted([*json.loads(low), *map(float, cosines)])[:MAX_LOW]
            self._db.execute(
                "UPDATE evidence SET samples = ?, cos_min = MIN(cos_min, ?), cos_sum = cos_sum + ?,"
                " low = ?, updated_at = ? WHERE use_case = ? AND release = ?",
                (
                    n,
                    float(min(cosines)),
                    float(sum(cosines)),
                    json.dumps(merged),
                    time.time(),
                    case,
                    release,
                ),
            )

    def record_timing(
        self,
        case: str,
        release: str,
        canonical_before: float,
        shadow: float,
        canonical_after: float,
    ) -> None:
        if min(canonical_before, shadow, canonical_after) <= 0:
            return
        lr = math.log(shadow / ((canonical_before + canonical_after) / 2))
        aa = math.log(canonical_after / canonical_before)
        with self._writing():
            self._ensure(case, release)
            self._db.execute(
                "UPDATE evidence SET timed = timed + 1, lr_sum = lr_sum + ?, lr_sq = lr_sq + ?, "
                "aa_sum = aa_sum + ?, updated_at = ? WHERE use_case = ? AND release = ?",
                (lr, lr * lr, aa, time.time(), case, release),
            )

    def record_overlap(self, case: str, release: str, overlap: float, probes: int) -> None:
        with self._writing():
            self._ensure(case, release)
            self._db.execute(
                "UPDATE evidence SET overlap = ?, probes = ?, updated_at = ? "
                "WHERE use_case = ? AND release = ?",
                (overlap, probes, time.time(), case, release),
            )

    def _bump(self, column: str, case: str, release: str) -> None:
        with self._writing():
            self._ensure(case, release)
            self._db.execute(
                f"UPDATE evidence SET {column} = {column} + 1, updated_at = ? "
                "WHERE use_case = ? AND release = ?",
                (time.time(), case, release),
            )

    def record_error(self, case: str, release: str) -> None:
        self._bump("errors", case, release)

    def record_drop(self, case: str, release: str) -> None:
        self._bump("dropped", case, release)

    # -- reading -------------------------------------------------------------------------

    def releases(self, case: str, gates: Gates) -> list[ReleaseEvidence]:
        rows = self._db.execute(
            "SELECT release, samples, cos_min, cos_sum, low, overlap, probes, timed, lr_sum, "
            "lr_sq, aa_sum, errors, dropped FROM evidence WHERE use_case = ? ORDER BY first_at",
            (case,),
        ).fetchall()
        return [self._evidence(r, gates) for r in rows]

    @staticmethod
    def _evidence(row: tuple, g: Gates) -> ReleaseEvidence:
        (
            release,
            n,
            cmin,
            csum,
            low,
            overlap,
            probes,
            timed,
            lr_sum,
            lr_sq,
            aa_sum,
            errors,
            dropped,
        ) = row
        low = json.loads(low)
        p1 = low[min(len(low), max(1, math.ceil(0.01 * n))) - 1] if low else 0.0
        mean = csum / n if n else 0.0
        ratio = upper = aa = 0.0
        if timed:
            m = lr_sum / timed
            var = max(0.0, lr_sq / timed - m * m) * timed / max(1, timed - 1)
            ratio = math.exp(m)
            upper = math.exp(m + Z_95 * math.sqrt(var / timed)) if timed > 1 else math.inf
            aa = math.exp(aa_sum / timed)
        ev = ReleaseEvidence(
            shadow=release,
            samples=n,
            cosine_min=cmin if n else 0.0,
            cosine_p1=p1,
            cosine_mean=mean,
            overlap_at_10=overlap,
            probes=probes,
            time_ratio=ratio,
            time_ratio_upper=upper,
            aa_time_ratio=aa,
            timed_batches=timed,
            errors=errors,
            dropped=dropped,
        )
        return replace(ev, passed_g1=passes_g1(ev, g), passed_g2=passes_g2(ev, g))

    def serving(self, case: str) -> str | None:
        row = self._db.execute(
            "SELECT serving FROM case_state WHERE use_case = ?", (case,)
        ).fetchone()
        return row[0] if row else None

    def set_serving(self, case: str, serving: str, action: str, forced: bool, reason: str) -> None:
        now = time.time()
        with self._writing(), transaction(self._db) as db:
            db.execute("INSERT OR REPLACE INTO case_state VALUES (?, ?, ?)", (case, serving, now))
            db.execute(
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


def passes_g1(ev: ReleaseEvidence, g: Gates) -> bool:
    """G1 agreement: enough compared vectors and probes, every cosine criterion met."""
    return (
        ev.samples >= g.min_samples
        and ev.cosine_min >= g.min_cosine
        and ev.cosine_mean >= g.mean_cosine
        and ev.probes >= g.min_probes
        and ev.overlap_at_10 >= g.min_overlap
    )


def passes_g2(ev: ReleaseEvidence, g: Gates) -> bool:
    """G2 performance: enough A/B/A-timed batches, the ratio's upper 95% bound in bounds."""
    return ev.timed_batches >= g.min_timed_batches and ev.time_ratio_upper <= g.max_time_ratio


def stable(ev: ReleaseEvidence, g: Gates) -> bool:
    """What G3 counts: a release that passed G1 and G2 without a single shadow error."""
    return passes_g1(ev, g) and passes_g2(ev, g) and ev.errors == 0


def evaluate_gates(
    releases: Sequence[ReleaseEvidence],
    current: str,
    g: Gates,
    recorded: Sequence[ReleaseEvidence] = (),
) -> tuple[tuple[GateResult, ...], bool]:
    """G1 and G2 on the current shadow release's live evidence; G3 over the releases
    `recorded` in the committed release history (server.shadow.releases), judged again
    against today's gates, plus the current release when its live evidence passes now.
    Releases only this data directory has seen do not count: a history that a fresh data
    directory forgets is no evidence of stability. Returns the gates and whether the case
    is flip-eligible (all three pass)."""
    cur = next((r for r in releases if r.shadow == current), ReleaseEvidence(shadow=current))
    miss1 = []
    if cur.samples < g.min_samples:
        miss1.append(f"{g.min_samples - cur.samples} more compared vectors")
    if cur.samples and cur.cosine_min < g.min_cosine:
        miss1.append(f"min cosine >= {g.min_cosine}")
    if cur.samples and cur.cosine_mean < g.mean_cosine:
        miss1.append(f"mean cosine >= {g.mean_cosine}")
    if cur.probes < g.min_probes:
        miss1.append(f"{g.min_probes - cur.probes} more probe queries")
    elif cur.overlap_at_10 < g.min_overlap:
        miss1.append(f"overlap@10 >= {g.min_overlap}")
    g1 = GateResult(
        "G1 agreement",
        cur.passed_g1,
        f"n={cur.samples} min={cur.cosine_min:.6f} p1={cur.cosine_p1:.6f} "
        f"mean={cur.cosine_mean:.7f} overlap@10={cur.overlap_at_10:.3f} ({cur.probes} probes)",
        "; ".join(miss1),
    )
    miss2 = []
    if cur.timed_batches < g.min_timed_batches:
        miss2.append(f"{g.min_timed_batches - cur.timed_batches} more timed batches")
    elif cur.time_ratio_upper > g.max_time_ratio:
        miss2.append(
            f"time ratio upper bound <= {g.max_time_ratio} "
            f"(shadow must get {cur.time_ratio_upper / g.max_time_ratio:.2f}x faster)"
        )
    g2 = GateResult(
        "G2 performance",
        cur.passed_g2,
        f"ratio={cur.time_ratio:.3f} upper95={cur.time_ratio_upper:.3f} "
        f"A/A={cur.aa_time_ratio:.3f} over {cur.timed_batches} batches",
        "; ".join(miss2),
    )
    counted = {r.shadow: "recorded" for r in recorded if stable(r, g)}
    if stable(cur, g):
        counted.setdefault(cur.shadow, "live")
    g3_ok = len(counted) >= g.min_releases
    g3 = GateResult(
        "G3 stability",
        g3_ok,
        f"{len(counted)} of {g.min_releases} releases passed G1+G2 with no errors"
        + (f" ({', '.join(f'{k} {v}' for k, v in counted.items())})" if counted else "")
        + f"; {len(recorded)} recorded in the release history",
        ""
        if g3_ok
        else f"{g.min_releases - len(counted)} more passing release(s) recorded "
        "(`ragplane shadow record-release`)",
    )
    gates = (g1, g2, g3)
    return gates, all(x.passed for x in gates)
