"""In-memory state of one open collection, and the locks that guard it.

Lock order (outermost first): maint_lock -> write_mutex -> the store's writer lock -> rw.
Per collection, `write_mutex` serialises writers (so sequence numbers reach FAISS in
commit order) and the swap step of a rebuild; `rw` is a readers-writer lock: searches
share it, FAISS adds and index swaps take it exclusively. `maint_lock` admits one rebuild,
rollback or compaction at a time; `ckpt_lock` guards the checkpoint directory.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragplane.core.errors import FailedPrecondition
from ragplane.index import faiss_index as fx
from ragplane.index.types import Chunking, IndexParams, IndexType, Kind, Metric, Splitter


class _Held:
    """`with`: `enter()` then `exit()`; reused for every holder, so a search's locks cost
    two calls, not a generator (contextlib's) made and stepped each time."""

    __slots__ = ("enter", "exit")

    def __init__(self, enter: Callable[[], None], exit: Callable[[], None]) -> None:
        self.enter, self.exit = enter, exit

    def __enter__(self) -> None:
        self.enter()

    def __exit__(self, *exc: object) -> None:
        self.exit()


class RWLock:
    """Writer-preferring readers-writer lock (not re-entrant)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting = 0
        self._read = _Held(self._acquire_read, self._release_read)
        self._write = _Held(self._acquire_write, self._release_write)

    def read(self) -> _Held:
        return self._read

    def write(self) -> _Held:
        return self._write

    def _acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1

    def _release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            # only a writer waits for the readers to leave (readers wait for a writer,
            # whose release wakes them)
            if self._readers == 0 and self._waiting:
                self._cond.notify_all()

    def _acquire_write(self) -> None:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True

    def _release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


@dataclass(eq=False)
class Coll:
    id: int
    tenant: str
    name: str
    dim: int
    metric: Metric
    index_type: IndexType  # requested
    embedder: str
    params: IndexParams  # requested
    generation: int
    created_at: float
    dir: Path
    built_type: IndexType = IndexType.FLAT  # what the FAISS index is
    purpose: Kind = Kind.COLLECTION  # which namespace of the tenant the name lives in
    lexical: bool = True  # keeps an FTS5 index of item text (index.lexical)
    chunking: Chunking = field(default_factory=Chunking)
    rparams: IndexParams = field(default_factory=IndexParams)  # resolved for `built_type`
    index: Any = None
    indexed_seq: int = 0  # every committed row of this collection up to here is indexed
    # live (not deleted, indexed) sequence numbers: 1 bit per number up to the highest
    live: fx.LiveBits = field(default_factory=fx.LiveBits)
    live_count: int = 0
    seq_to_id: dict[int, str] = field(default_factory=dict)
    # live seqs of chunks past an item's first: live items = live_count - len(tails)
    tails: set[int] = field(default_factory=set)
    rw: RWLock = field(default_factory=RWLock)
    write_mutex: threading.Lock = field(default_factory=threading.Lock)
    maint_lock: threading.Lock = field(default_factory=threading.Lock)
    ckpt_lock: threading.Lock = field(default_factory=threading.Lock)
    writes_since_ckpt: int = 0
    dropped: bool = False
    _live_sel: fx.BitmapSelector | None = None
    # bumped whenever rows are added, so cached filter results know they are stale
    version: int = 0
    # (filter SQL, args) -> (version, the matching rows' seqs)
    filter_cache: OrderedDict[tuple[str, tuple[Any, ...]], tuple[int, np.ndarray]] = field(
        default_factory=OrderedDict
    )
    cache_lock: threading.Lock = field(default_factory=threading.Lock)
    # (generation, digest of a small filter's matching seqs) -> (their seqs, their lossy
    # codes decoded, squared norms): search.py's scan of a repeated filter; under cache_lock
    decoded_cache: OrderedDict[tuple[int, bytes], tuple[np.ndarray, np.ndarray, np.ndarray]] = (
        field(default_factory=OrderedDict)
    )

    # -- called with rw held for writing --
    def mark_live(self, seqs: np.ndarray, ids: Sequence[str], tails: Sequence[int] = ()) -> None:
        """`tails`: those of `seqs` that are chunks past their item's first."""
        if seqs.size:
            self.live.add(seqs)
            self.seq_to_id.update(zip(seqs.tolist(), ids, strict=True))
            self.live_count += int(seqs.size)
            self.tails.update(tails)
            self._live_sel = None
            self.version += 1

    def mark_dead(self, seqs: Sequence[int]) -> None:
        gone = [s for s in seqs if self.seq_to_id.pop(s, None) is not None]
        if gone:
            self.live.discard(np.asarray(gone, dtype=np.int64))
            self.live_count -= len(gone)
            if self.tails:
                self.tails.difference_update(gone)
        self._live_sel = None

    # -- called with rw held (either mode) --
    @property
    def item_count(self) -> int:
        return self.live_count - len(self.tails)

    @property
    def split(self) -> bool:
        """Whether some live item has several chunks (searches then group rows by item)."""
        return bool(self.tails)

    def live_selector(self) -> fx.BitmapSelector:
        sel = self._live_sel
        if sel is None:
            sel = self._live_sel = self.live.selector()
        return sel


    @contextmanager
    def maintenance(self) -> Iterator[None]:
        """Hold `maint_lock`, refusing (not waiting) when another maintenance job runs."""
        if not self.maint_lock.acquire(blocking=False):
            raise FailedPrecondition(
                f"a rebuild, rollback or compaction of {self.name!r} is already running; wait "
                "for it to finish"
            )
        try:
            yield
        finally:
            self.maint_lock.release()


def chunking_json(ch: Chunking) -> str:
    return json.dumps(asdict(ch), sort_keys=True) if ch.enabled else ""


def chunking_from(s: str) -> Chunking:
    if not s:
        return Chunking()
    d = json.loads(s)
    return Chunking(
        enabled=bool(d["enabled"]), max_tokens=int(d["max_tokens"]),
        overlap_tokens=int(d["overlap_tokens"]), splitter=Splitter(d["splitter"]),
        min_tokens=int(d.get("min_tokens", d["max_tokens"])),
    )


def params_json(p: IndexParams) -> str:
    return json.dumps(asdict(p), sort_keys=True)


def params_from(s: str) -> IndexParams:
    return IndexParams(**json.loads(s))


def blob_matrix(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), dim)
