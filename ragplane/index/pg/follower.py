"""A server's cache (its local indexes) following the shared store's change log.

The local `Engine` (SQLite + FAISS + FTS5 in the server's cache folder) is written only by
applying the log, in position order, so every server holds the same state at the same
position and answers with the same BM25 and the same exact top-k. `LogFollower` owns the
applying: one thread follows the log (NOTIFY wakes it, polling is the fallback), and a
write made here applies its own change before it returns (read-your-writes on this server).

Applying is idempotent (a replace, a delete, a create of what exists is skipped): the
position saved in `cache.json` may trail what the cache holds after a crash, and the
changes between are applied again. A cache that follows another store, or one behind
what the log still keeps, is thrown away and rebuilt from the state tables.

The cache does not sync its commits to disk (PostgreSQL holds the truth): they survive a
crash of the process, not always one of the machine. cache.json says while the cache is
open, and since which boot of the machine; an open cache found after a restart of the
machine is rebuilt from the tables, one closed cleanly (synced first) is kept."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ragplane.core.errors import RagplaneError, Unavailable
from ragplane.index.engine import Engine
from ragplane.index.faiss_index import fsync_dir
from ragplane.index.pg import codec
from ragplane.index.pg.changes import CollectionConfig, Create
from ragplane.index.pg.log import RETRY_AFTER, Change, PgStore, wait_left
from ragplane.index.types import Kind, Lease, Peer

log = logging.getLogger(__name__)

STATE_FILE = "cache.json"


def _boot_id() -> str:
    """This boot of the machine (Linux); "" where unknown (an open cache is then rebuilt)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT = _boot_id()
LOAD_BATCH = 2000
PRUNE_EVERY = 60.0  # seconds between a server's attempts to trim the log


class LogFollower:
    """The local engine (the cache), the position applied to it, and the thread that
    follows the log: `ragplane.index.backend.Follower` for the server above."""

    def __init__(
        self,
        store: PgStore,
        cache_dir: Path,
        open_engine: Callable[..., Engine],
        *,
        poll_interval: float = 0.2,
        stale_after: float = 1.0,
        log_keep: int = 1_000_000,
    ) -> None:
        self.store = store
        self.dir = Path(cache_dir)
        self._open_engine = open_engine
        self._poll = poll_interval
        self._stale_after = stale_after
        self._log_keep = log_keep
        self._saved = -1
        self._is_open = True  # what cache.json says: the cache's commits may be unsynced
        self._next_prune = time.monotonic() + PRUNE_EVERY
        self.lock = threading.RLock()  # held while applying; writes here hold it too
        self._applied_cv = threading.Condition()
        self.applied = 0
        self.writing = 0  # the position a write here is committing (its NOTIFY is no news)
        self.head_seen = 0
        self.last_contact = 0.0
        self.ready = False
        self.broken: str | None = None
        # the apply lag of each change the follower applies (seconds from its commit to
        # here), for the metrics; and whether the last look at the log found nothing new
        self.on_lag: Callable[[float], None] | None = None
        self.caught_up_at = 0.0
        self.last_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.store.migrate()
        self.engine = self._open()
        self.last_contact = time.monotonic()

    @property
    def store_id(self) -> str:
        return self.store.store_id

    # ------------------------------------------------------------------ opening

    def _open(self) -> Engine:
        state = self._read_state()
        if state.get("store_id") != self.store.store_id:
            if state:
                log.info("the local cache follows another store; rebuilding it")
            return self._load_from_tables()
        if state.get("open") and (not state.get("boot") or state["boot"] != BOOT):
            log.info("the machine restarted while the local cache was open (its commits are "
                     "not synced: PostgreSQL holds the truth); rebuilding it")
            return self._load_from_tables()
        engine = self._open_engine(self.dir, durable=False)
        self.engine = engine
        self.applied = int(state.get("pos", 0))
        if self.store.oldest() > self.applied + 1:
            log.info("the local cache (position %d) is behind what the log keeps; rebuilding",
                     self.applied)
            engine.close()
            return self._load_from_tables()
        self._save_state(synced=True)  # "open" on disk before the first unsynced commit
        return engine

    def _read_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads((self.dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return state

    def _save_state(self, synced: bool = False) -> None:
        """cache.json: the store followed, the position applied, and whether the cache
        is open (and since which boot of the machine: an open cache the machine restarted
        under may have lost commits). `synced` when the "open" flag changes."""
        if self._saved == self.applied and not synced:
            return
        tmp = self.dir / (STATE_FILE + ".tmp")
        state = {"store_id": self.store.store_id, "pos": self.applied,
                 "open": self._is_open, "boot": BOOT}
        with open(tmp, "w") as f:
            f.write(json.dumps(state))
            if synced:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.dir / STATE_FILE)
        if synced:
            fsync_dir(self.dir)
        self._saved = self.applied

    def _load_from_tables(self) -> Engine:
        """A fresh cache from rp_collections and rp_items, at the head they reflect."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        engine = self._open_engine(self.dir, durable=False)
        self.engine = engine
        t0 = time.monotonic()
        n = 0
        with self.store.snapshot() as (c, head):
            colls = c.execute(
                "SELECT tenant, kind, name, config FROM rp_collections ORDER BY tenant, kind, name"
            ).fetchall()
            for tenant, kind, name, config in colls:
                create = Create(tenant, Kind(kind), name, CollectionConfig.from_json(config))
                create.apply(engine, self.store, head)
                n += self._load_items(c, engine.of_kind(Kind(kind)), tenant, kind, name,
                                      create.config.dim)
        self.applied = head
        self._save_state(synced=True)
        log.info("local cache loaded from the store: %d collections, %d items at position "
                 "%d in %.1f s", len(colls), n, head, time.monotonic() - t0)
        return engine

    @staticmethod
    def _load_items(c: Any, view: Engine, tenant: str, kind: str, name: str, dim: int) -> int:
        n = 0
        with c.cursor(name=f"load_{n}") as cur:
            cur.itersize = LOAD_BATCH
            cur.execute(
                "SELECT body, vectors FROM rp_items WHERE tenant = %s AND kind = %s AND "
                "coll = %s ORDER BY pos, id",
                (tenant, kind, name),
            )
            while rows := cur.fetchmany(LOAD_BATCH):
                items = [body for body, _ in rows]
                blob = b"".join(bytes(v) for _, v in rows)
                view.upsert(tenant, name, codec.decode_records(items, blob, dim))
                n += len(rows)
        return n

    # ------------------------------------------------------------------ applying

    def start(self) -> None:
        """Catch up with the log (the caller reports SERVING after), then follow it."""
        self.catch_up()
        self.ready = True
        self._thread = threading.Thread(target=self._follow, name="follower", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.lock:
            self.engine.close()
            with contextlib.suppress(OSError):
                for path in self.dir.rglob("*"):  # the cache's commits reach the disk ...
                    fsync_dir(path)
                self._is_open = False  # ... before cache.json calls it closed
                self._save_state(synced=True)
        self.store.close()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The lock that orders writing and applying here, waited for within the call's
        budget (`log.budget`; without one, as long as it takes): Unavailable after."""
        wait = wait_left(None)
        if not self.lock.acquire(timeout=-1 if wait is None else wait):
            raise Unavailable(
                f"this server's writes are queued behind others for over {wait:.1f} s; retry",
                RETRY_AFTER,
            )
        try:
            yield
        finally:
            self.lock.release()

    def catch_up(self, upto: int | None = None) -> int:
        """Apply every committed change after `applied` (up to `upto`); returns applied."""
        with self.locked():
            while upto is None or self.applied < upto:
                batch = self.store.changes_after(self.applied)
                self.last_contact = time.monotonic()
                if not batch:
                    self.caught_up_at = time.time()
                    break
                for ch in batch:
                    if upto is not None and ch.pos > upto:
                        break
                    self.apply(ch)
                self._save_state()
            return self.applied

    def apply(self, ch: Change) -> None:
        """Apply one change to the local engine (called with `lock` held)."""
        try:
            ch.op.apply(self.engine, self.store, ch.pos)
        except Unavailable:  # PostgreSQL away while reading the change: not applied yet
            raise
        except RagplaneError as exc:
            # a change the writer validated cannot fail here unless the cache is broken
            self.broken = f"change {ch.pos} could not be applied: {exc}"
            raise Unavailable(f"this server's cache is behind: {self.broken}", 1.0) from exc
        self.broken = None
        self.advance(ch.pos)
        if ch.at:
            self.last_at = ch.at
            if self.on_lag is not None:
                self.on_lag(max(0.0, time.time() - ch.at))

    def peers(self) -> tuple[list[Peer], list[Lease]]:
        """The servers connected to the store now and the leases they hold (`pg.peers`)."""
        return self.store.peers()

    def lag_seconds(self) -> float:
        """0 when the last look at the log found nothing new since; else how old the last
        applied change is (how far behind the log this server is, at least)."""
        if self.caught_up_at >= self.last_at:
            return 0.0
        return max(0.0, time.time() - self.last_at)

    def advance(self, pos: int) -> None:
        with self._applied_cv:
            self.applied = pos
            self.head_seen = max(self.head_seen, pos)
            self._applied_cv.notify_all()

    def _follow(self) -> None:
        listener = None
        notified = 0  # the newest position a NOTIFY named since the last look at the log
        try:
            while not self._stop.is_set():
                try:
                    if listener is None:
                        listener = self.store.listener()
                    if self.broken is not None:
                        self.reload()
                    if 0 < notified <= max(self.applied, self.writing):  # a write's here
                        self.last_contact = time.monotonic()  # the notice came: in touch
                    elif self.lock.acquire(timeout=self._poll):
                        try:
                            self.catch_up()
                            self._save_state()
                        finally:
                            self.lock.release()
                    else:  # a long write holds the cache (a re-embedding rebuild): still here
                        self.store.head()
                        self.last_contact = time.monotonic()
                    self._maybe_prune()
                    notified = 0
                    for n in listener.notifies(timeout=self._poll, stop_after=1):
                        notified = int(n.payload) if n.payload.isdigit() else 0
                except Exception as exc:  # PostgreSQL away: keep trying, report unhealthy
                    if isinstance(exc, Unavailable):
                        log.warning("%s", exc)
                    else:
                        log.exception("following the change log failed")
                    _close(listener)
                    listener = None
                    self._stop.wait(self._poll)
        finally:
            _close(listener)

    def reload(self) -> None:
        """Throw the cache away and load it from the tables (a change that could not be
        applied, or a write whose local effect may differ from what committed)."""
        with self.lock:
            log.warning("reloading the local cache from the store: %s", self.broken)
            self.ready = False
            self.engine.close()
            self.engine = self._load_from_tables()
            self.broken = None
            self.ready = True

    def _maybe_prune(self) -> None:
        """One server at a time trims the log to `log_keep` changes behind the head."""
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_EVERY
        with self.store.lease("prune") as got:
            if got and (n := self.store.prune(self._log_keep)):
                log.info("trimmed %d changes from the log (keeping %d)", n, self._log_keep)

    # ------------------------------------------------------------------ reads

    def healthy(self) -> bool:
        """Ready, applying, and in touch with PostgreSQL within `stale_after` seconds."""
        return (
            self.ready
            and self.broken is None
            and time.monotonic() - self.last_contact <= self._stale_after + self._poll
        )

    def check(self) -> None:
        """Raise Unavailable unless this server can answer from an up-to-date cache."""
        if not self.ready:
            raise Unavailable("this server is still catching up with the store; retry", 1.0)
        if self.broken is not None:
            raise Unavailable(f"this server's cache is behind: {self.broken}; retry", 1.0)
        idle = time.monotonic() - self.last_contact
        if idle > self._stale_after + self._poll:
            raise Unavailable(
                f"PostgreSQL ({self.store.where}) has not answered for {idle:.1f} s; retry",
                1.0,
            )

    def wait_for(self, pos: int, timeout: float) -> None:
        """Block until `pos` is applied, or raise Unavailable after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._applied_cv:
            while self.applied < pos:
                left = deadline - time.monotonic()
                if left <= 0:
                    lag = pos - self.applied
                    raise Unavailable(
                        f"this server has not yet applied the write of this consistency "
                        f"token ({lag} changes behind after {timeout * 1e3:.0f} ms); retry, "
                        "or read from the server that wrote it",
                        max(0.1, min(1.0, timeout)),
                    )
                self._applied_cv.wait(min(left, 0.05))


def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
