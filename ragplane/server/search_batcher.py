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
from dataclasses import dataclass, field

import numpy as np

from ragplane.index.backend import Store
from ragplane.index.types import Filter, SearchKnobs, SearchResult


class _Waiter:
    """One caller's search. `wake` is held from the start; releasing it wakes the caller:
    with its result or error set, or `lead` set (it runs the next batch)."""

    __slots__ = ("key", "vector", "wake", "lead", "result", "error")

    def __init__(self, key: Hashable, vector: np.ndarray) -> None:
        self.key, self.vector = key, vector
        self.wake = threading.Lock()
        self.wake.acquire()
        self.lead = False
        self.result: SearchResult | None = None
        self.error: BaseException | None = None


@dataclass
class _Lane:
    """A collection with a batch running; `waiting` arrived meanwhile, oldest first."""

    waiting: list[_Waiter] = field(default_factory=list)


class SearchCoalescer:
    def __init__(self, engine: Store, max_batch: int = 64, min_vectors: int = 0) -> None:
        self.engine = engine
        self.max_batch = max(1, max_batch)
        self.min_vectors = max(0, min_vectors)
        self._mu = threading.Lock()
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
            with self._mu:
                self.calls += 1
                self.queries += 1
            return self.engine.search(
                tenant, name, vector[None, :], top_k, filter=filter, include_text=include_text,
                include_metadata=include_metadata, chunks_per_hit=chunks_per_hit, knobs=knobs,
            )[0]  # fmt: skip
        me = _Waiter((top_k, filter, include_text, include_metadata, chunks_per_hit, knobs),
                     vector)  # fmt: skip
        lane_key = (tenant, name)
        with self._mu:
            lane = self._lanes.get(lane_key)
            if lane is None:  # nothing running: lead at once
                self._lanes[lane_key] = lane = _Lane()
                me.lead = True
            else:
                lane.waiting.append(me)
        if not me.lead:
            me.wake.acquire()  # one wake-up: answered, or handed the lead
        if me.lead:
            self._lead(tenant, name, lane_key, lane, me)
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    def _lead(self, tenant: str, name: str, lane_key: tuple[str, str], lane: _Lane,
              me: _Waiter) -> None:  # fmt: skip
        """Run `me` with the waiting searches that share its parameters (up to `max_batch`,
        oldest first), then hand the lead to the oldest still waiting, or close the lane."""
        group = [me]
        try:
            with self._mu:
                rest = []
                for w in lane.waiting:
                    if w.key == me.key and len(group) < self.max_batch:
                        group.append(w)
                    else:
                        rest.append(w)
                lane.waiting = rest
            self._run(tenant, name, group)
        finally:
            with self._mu:
                nxt = lane.waiting.pop(0) if lane.waiting else None
                if nxt is not None:
                    nxt.lead = True
                else:
                    del self._lanes[lane_key]
            if nxt is not None:  # first: its batch overlaps the answers below
                nxt.wake.release()
            for w in group[1:]:
                w.wake.release()

    def _run(self, tenant: str, name: str, group: list[_Waiter]) -> None:
        top_k, filter, include_text, include_metadata, per_hit, knobs = group[0].key  # type: ignore[misc]
        try:
            queries = np.stack([w.vector for w in group]).astype(np.float32, copy=False)
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
                w.error = exc
            return
        with self._mu:
            self.calls += 1
            self.queries += len(group)
        for w, r in zip(group, results, strict=True):
            w.result = r
