"""Coalesce concurrent searches of one collection into batched FAISS calls.

FAISS answers a [q, dim] batch far faster than q calls of [1, dim]. A caller that finds
no search of its collection in flight runs at once (no added latency at low load); while
one runs, others queue, and when it finishes, one waiting caller becomes the next leader
and runs up to `max_batch` queued searches (oldest first) in one call. Searches with
different parameters (top_k, filter, includes, search knobs) are grouped separately.

Below `min_vectors` vectors a collection's scan costs less than the hand-off between
threads that batching needs (a wait, a wake-up, the GIL changing hands), so its searches
run at once, each its own call.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ragplane.index.backend import Store
from ragplane.index.types import Filter, SearchKnobs, SearchResult


@dataclass
class _Lane:
    busy: bool = False
    waiting: list[tuple[Hashable, np.ndarray, Future[SearchResult]]] = field(default_factory=list)


class SearchCoalescer:
    def __init__(self, engine: Store, max_batch: int = 64, min_vectors: int = 0) -> None:
        self.engine = engine
        self.max_batch = max(1, max_batch)
        self.min_vectors = max(0, min_vectors)
        self._cond = threading.Condition()
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self.calls = 0
        self.queries = 0

    def coalesces(self, vectors: int | None) -> bool:
        """Whether a search of a collection of `vectors` waits to share an engine call
        (False: it runs at once, alone; the engine checks its query)."""
        return vectors is None or vectors >= self.min_vectors

    def search(
        self,
        tenant: str,
        name: str,
        vector: np.ndarray,
        top_k: int,
        *,
        filter: Filter | None,
        include_text: bool,
        include_metadata: bool,
        chunks_per_hit: int = 1,
        knobs: SearchKnobs | None = None,
        vectors: int | None = None,
    ) -> SearchResult:
        """`vectors`: how many the collection holds (None: unknown, so coalesced)."""
        if not self.coalesces(vectors):
            self.calls += 1
            self.queries += 1
            return self.engine.search(
                tenant, name, vector[None, :], top_k, filter=filter, include_text=include_text,
                include_metadata=include_metadata, chunks_per_hit=chunks_per_hit, knobs=knobs,
            )[0]  # fmt: skip
        key = (top_k, filter, include_text, include_metadata, chunks_per_hit, knobs)
        fut: Future[SearchResult] = Future()
        lane_key = (tenant, name)
        with self._cond:
            lane = self._lanes.setdefault(lane_key, _Lane())
            lane.waiting.append((key, vector, fut))
        while True:
            with self._cond:
                while not fut.done() and lane.busy:
                    self._cond.wait()
                if fut.done():
                    return fut.result()
                lane.busy = True
                first = lane.waiting[0][0]
                group = [w for w in lane.waiting if w[0] == first][: self.max_batch]
                taken = {id(w[2]) for w in group}
                lane.waiting = [w for w in lane.waiting if id(w[2]) not in taken]
            try:
                self._run(tenant, name, group)
            finally:
                with self._cond:
                    lane.busy = False
                    if not lane.waiting and self._lanes.get(lane_key) is lane:
                        del self._lanes[lane_key]
                    self._cond.notify_all()

    def _run(
        self, tenant: str, name: str, group: list[tuple[Hashable, np.ndarray, Future[SearchResult]]]
    ) -> None:
        top_k, filter, include_text, include_metadata, per_hit, knobs = group[0][0]  # type: ignore[misc]
        try:
            queries = np.stack([w[1] for w in group]).astype(np.float32, copy=False)
            results = self.engine.search(
                tenant,
                name,
                queries,
                top_k,
                filter=filter,
                include_text=include_text,
                include_metadata=include_metadata,
                chunks_per_hit=per_hit,
                knobs=knobs,
            )
        except BaseException as exc:  # every caller of the batch hears the error
            for w in group:
                w[2].set_exception(exc)
            return
        self.calls += 1
        self.queries += len(group)
        for w, r in zip(group, results, strict=True):
            w[2].set_result(r)
