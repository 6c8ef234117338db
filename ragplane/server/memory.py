"""Agent memory: namespaced facts, deduplicated on write, recalled by a combined score.

Built on the index engine: each namespace is a flat cosine collection of kind "memory"
(`index.Kind.MEMORY`) of the tenant, so memories are as durable as collections (SQLite
first, FAISS derived) and never show among the tenant's collections.
System fields live under the reserved metadata key ``__rp``.

Recall score (documented in the API): a weighted mean of three parts,

    score = (w_rel * relevance + w_rec * recency + w_imp * importance) / (w_rel + w_rec + w_imp)

* relevance: cosine similarity of query and memory, in [-1, 1] (Recall's default, dense
  mode); in lexical or hybrid mode the memory's BM25 or fused score divided by the best
  candidate's, in [0, 1];
* recency: 0.5 ** (age / half_life), age = now - last update, in (0, 1];
* importance: as remembered, in [0, 1].

as in Generative Agents (Park et al., 2023), which sums the same three parts. Candidates are
the most relevant `max(10 * top_k, 100)` live memories, re-ranked by the score.

A memory is one vector unless its text is longer than the embedder's window: then it is
chunked as collection items are (`ragplane.server.chunking`; namespaces made before
chunking keep one truncated vector), ranks by its best chunk, and is deduplicated by its
first chunk's vector. A namespace holds one embedder's vectors: text is embedded for it
(remembered or as a query) only by that embedder or one the shadow says agrees with it (G1),
as for collections (`embedded_items.py`).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ragplane.core.errors import AlreadyExists, InvalidArgument, NotFound, RagplaneError
from ragplane.index.backend import Store
from ragplane.index.fusion import check as check_fusion
from ragplane.index.types import (
    CollectionInfo,
    Condition,
    Filter,
    FilterOp,
    Fusion,
    Hit,
    IndexType,
    Kind,
    Metric,
    Record,
    SearchMode,
    Span,
)
from ragplane.index.validate import check_name
from ragplane.server import auth, chunking
from ragplane.server.embedded_items import Compatible, ItemEmbedding
from ragplane.server.embedding.base import Embedder
from ragplane.server.embedding.service import EmbeddingService

log = logging.getLogger(__name__)

RESERVED = "__rp"
NEVER = 253402300799.0  # 9999-12-31: "never expires" as a number filters can compare
MAX_PAGE = 1000


@dataclass(frozen=True)
class Memory:
    id: str
    namespace: str
    text: str
    metadata: Mapping[str, Any]
    importance: float
    created_at: float
    updated_at: float
    expires_at: float  # 0 = never
    score: float = 0.0
    relevance: float = 0.0
    recency: float = 0.0
    # The relevance's sources, as in index.types.Hit; None where the mode did not compute one.
    dense: float | None = None
    lexical: float | None = None
    fused: float | None = None


@dataclass(frozen=True)
class Weights:
    relevance: float = 1.0
    recency: float = 0.5
    importance: float = 0.5


@dataclass
class MemoryService:
    engine: Store
    embedding: EmbeddingService
    dedup_threshold: float = 0.95
    half_life_seconds: float = 7 * 86400.0
    weights: Weights = field(default_factory=Weights)
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._store = self.engine.of_kind(Kind.MEMORY)
        self.embedded = ItemEmbedding(self.embedding)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        self.sweep_every = 0.0  # seconds between sweeps (0: no sweeper runs)
        self.last_sweep: tuple[float, int] | None = None  # (when, memories removed)

    def set_compatibility(self, compatible: Compatible) -> None:
        """Which embedders' vectors a namespace may mix (the shadow's G1), as collections."""
        self.embedded.set_compatibility(compatible)

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    def _space() -> str:
        return auth.current.get().tenant

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        check_name(namespace, "namespace")

    def _lock(self, space: str, namespace: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((space, namespace), threading.Lock())

    def _exists(self, space: str, namespace: str) -> bool:
        try:
            self._store.describe(space, namespace)
            return True
        except NotFound:
            return False

    def _require(self, space: str, namespace: str) -> None:
        self._check_namespace(namespace)
        if not self._exists(space, namespace):
            raise NotFound(f"namespace {namespace!r} has no memories")

    def _live(self, now: float) -> Condition:
        return Condition(f"{RESERVED}.expires_at", FilterOp.GT, now)

    def _to_memory(self, namespace: str, r: Record | Any, **score: float) -> Memory:
        meta = dict(r.metadata)
        sys = meta.pop(RESERVED, {}) or {}
        expires = float(sys.get("expires_at", NEVER))
        return Memory(
            id=r.id,
            namespace=namespace,
            text=r.text,
            metadata=meta,
            importance=float(sys.get("importance", 0.5)),
            created_at=float(sys.get("created_at", 0.0)),
            updated_at=float(sys.get("updated_at", 0.0)),
            expires_at=0.0 if expires >= NEVER else expires,
            **score,
        )

    # -- API -----------------------------------------------------------------------------

    def remember(
        self,
        namespace: str,
        text: str,
        metadata: Mapping[str, Any] | None = None,
        importance: float | None = None,
        ttl_seconds: int = 0,
        *,
        is_active: Callable[[], bool] = lambda: True,
    ) -> tuple[str, bool]:
        self._check_namespace(namespace)
        if not text or not text.strip():
            raise InvalidArgument("text is empty; a memory needs text")
        importance = 0.5 if importance is None else float(importance)
        if not 0.0 <= importance <= 1.0 or importance != importance:
            raise InvalidArgument(f"importance must be in [0, 1], got {importance}")
        if ttl_seconds < 0:
            raise InvalidArgument(
                f"ttl_seconds must be >= 0 (0 = never expires), got {ttl_seconds}"
            )
        metadata = dict(metadata or {})
        if RESERVED in metadata:
            raise InvalidArgument(f"metadata key {RESERVED!r} is reserved")
        self.embedding.validate_texts([text])
        space = self._space()
        vec, spans = self._embed_memory(space, namespace, text, is_active)
        with self._lock(space, namespace):
            now = self.clock()
            if not self._exists(space, namespace):
                try:
                    self._store.create_collection(
                        space,
                        namespace,
                        dim=self.embedding.dim,
                        metric=Metric.COSINE,
                        index_type=IndexType.FLAT,
                        embedder=self.embedding.serving_embedder().identity,
                        chunking=self._chunking(),
                    )
                except AlreadyExists:  # made a moment ago through another server: use it
                    pass
            hits = self._store.search(
                space,
                namespace,
                vec,
                1,
                filter=Filter(must=(self._live(now),)),
                include_text=True,
                include_metadata=True,
            )[0].hits
            expires = now + ttl_seconds if ttl_seconds else NEVER
            if hits and hits[0].score >= self.dedup_threshold:
                old = self._to_memory(namespace, hits[0])
                merged = {**old.metadata, **metadata}
                sys = {
                    "importance": max(old.importance, importance),
                    "created_at": old.created_at,
                    "updated_at": now,
                    "expires_at": expires,
                }
                self._store.upsert(
                    space, namespace, [_record(old.id, vec, spans, text, {**merged, RESERVED: sys})]
                )
                return old.id, True
            mid = uuid.uuid4().hex
            sys = {
                "importance": importance,
                "created_at": now,
                "updated_at": now,
                "expires_at": expires,
            }
            self._store.upsert(
                space, namespace, [_record(mid, vec, spans, text, {**metadata, RESERVED: sys})]
            )
            return mid, False

    def _chunking(self):
        return chunking.resolve(None, self.embedding.serving_embedder().max_seq_length)

    def _embed_memory(
        self, space: str, namespace: str, text: str, is_active: Callable[[], bool]
    ) -> tuple[Any, list[Span]]:
        """The memory's vector (its first chunk's when it is split) and its chunks (none
        when it fits the window, or its namespace was made before chunking)."""
        try:
            info = self._store.describe(space, namespace)
        except NotFound:  # a new namespace: the serving embedder's, chunked at its window
            embedder, rule = self.embedding.serving_embedder(), self._chunking()
        else:
            embedder, rule = self._embedder_for(info, "the memory's text"), info.chunking
        if not rule.enabled:
            return self.embedded.embed_all([text], is_active)[0][0], []
        spans = self.embedded.chunks([text], rule, embedder, is_active)[0][0]
        return spans[0].vector, spans if len(spans) > 1 else []

    def _embedder_for(self, info: CollectionInfo, what: str) -> Embedder:
        return self.embedded.embedder_for(
            info.embedder, f"namespace {info.name!r}", what,
            "unflip the case (`ragplane shadow unflip`) to remember into it or recall from "
            "it, or forget the whole namespace (Forget with all) and remember again",
        )

    def recall(
        self,
        namespace: str,
        query: str,
        top_k: int = 10,
        filter: Filter | None = None,
        *,
        mode: SearchMode = SearchMode.DENSE,
        fusion: Fusion = Fusion(),  # noqa: B008 - frozen
        is_active: Callable[[], bool] = lambda: True,
    ) -> list[Memory]:
        space = self._space()
        self._require(space, namespace)
        if not query or not query.strip():
            raise InvalidArgument("query is empty")
        top_k = top_k or 10
        if not 0 < top_k <= MAX_PAGE:
            raise InvalidArgument(f"top_k must be in 1..{MAX_PAGE}, got {top_k}")
        if filter is not None and any(
            c.field.split(".")[0] == RESERVED
            for c in (*filter.must, *filter.should, *filter.must_not)
        ):
            raise InvalidArgument(f"filters may not name the reserved field {RESERVED!r}")
        now = self.clock()
        live = Filter(
            must=(self._live(now), *(filter.must if filter else ())),
            should=filter.should if filter else (),
            must_not=filter.must_not if filter else (),
        )
        k = min(max(10 * top_k, 100), 10_000)
        hits = self._candidates(space, namespace, query, k, live, mode, fusion, is_active)
        # BM25 and fused scores have no fixed scale: relative to the best candidate they
        # fall in [0, 1], beside recency and importance.
        best = max((h.score for h in hits), default=0.0)
        w = self.weights
        total = w.relevance + w.recency + w.importance
        scored = []
        for h in hits:
            m = self._to_memory(namespace, h)
            age = max(0.0, now - m.updated_at)
            recency = 0.5 ** (age / self.half_life_seconds)
            if mode is SearchMode.DENSE:
                relevance = h.score
            else:
                relevance = h.score / best if best > 0 else 0.0
            score = (
                w.relevance * relevance + w.recency * recency + w.importance * m.importance
            ) / total
            scored.append(
                replace(
                    m, score=score, relevance=relevance, recency=recency, dense=h.dense,
                    lexical=h.lexical, fused=h.fused,
                )
            )
        scored.sort(key=lambda m: (-m.score, m.id))
        return scored[:top_k]

    def _candidates(
        self,
        space: str,
        namespace: str,
        query: str,
        k: int,
        live: Filter,
        mode: SearchMode,
        fusion: Fusion,
        is_active: Callable[[], bool],
    ) -> Sequence[Hit]:
        """The `k` live memories most relevant to `query` by `mode`, with text and metadata."""
        opts = {"filter": live, "include_text": True, "include_metadata": True}
        if mode is SearchMode.LEXICAL:  # words only: no embedding needed
            return self._store.search_lexical(space, namespace, query, k, **opts).hits
        if mode is SearchMode.HYBRID:
            check_fusion(fusion)  # before the embedding is paid for
        self._embedder_for(self._store.describe(space, namespace), "the query")
        vec = self.embedding.embed([query], is_active=is_active).vectors[0]
        if mode is SearchMode.HYBRID:
            return self._store.search_hybrid(
                space, namespace, query, vec, k, fusion=fusion, **opts
            ).hits
        return self._store.search(space, namespace, vec, k, **opts)[0].hits

    def forget(
        self,
        namespace: str,
        *,
        ids: Sequence[str] | None = None,
        filter: Filter | None = None,
        everything: bool = False,
    ) -> int:
        space = self._space()
        self._require(space, namespace)
        if everything:
            with self._lock(space, namespace):
                n = self._store.describe(space, namespace).count
                self._store.delete_collection(space, namespace)
            return n
        if ids is None and (filter is None or filter.is_empty()):
            raise InvalidArgument(
                "Forget needs ids, a non-empty filter, or all=true to forget the whole namespace"
            )
        if ids is not None and not ids:
            raise InvalidArgument("ids is empty; name at least one id")
        with self._lock(space, namespace):
            return self._store.delete(space, namespace, ids=ids, filter=filter)

    def list(
        self, namespace: str, page_size: int = 50, page_token: str = ""
    ) -> tuple[list[Memory], str]:
        """Live memories ordered by (created_at, id); the token names the last one returned."""
        space = self._space()
        self._require(space, namespace)
        page_size = page_size or 50
        if not 0 < page_size <= MAX_PAGE:
            raise InvalidArgument(f"page_size must be in 1..{MAX_PAGE}, got {page_size}")
        after: tuple[float, str] | None = None
        if page_token:
            try:
                created, mid = json.loads(base64.urlsafe_b64decode(page_token.encode()))
                after = (float(created), str(mid))
            except (ValueError, TypeError):
                raise InvalidArgument("page_token is not one this server issued") from None
        rows = self._store.page(
            space,
            namespace,
            order_by=f"{RESERVED}.created_at",
            after=after,
            limit=page_size + 1,
            filter=Filter(must=(self._live(self.clock()),)),
        )
        page = [self._to_memory(namespace, r) for r in rows[:page_size]]
        token = ""
        if len(rows) > page_size:
            last = page[-1]
            token = base64.urlsafe_b64encode(
                json.dumps([last.created_at, last.id]).encode()
            ).decode()
        return page, token

    # -- expiry --------------------------------------------------------------------------

    def sweep(self) -> int:
        """Delete expired memories of every namespace of every tenant. Returns how many."""
        now = self.clock()
        expired = Filter(must=(Condition(f"{RESERVED}.expires_at", FilterOp.LTE, now),))
        removed = 0
        with self._store.run_once("memory-sweep") as mine:  # one server of a cluster sweeps
            if not mine:
                return 0
            for info in self._store.list_all_collections():
                try:
                    removed += self._store.delete(info.tenant, info.name, filter=expired)
                except NotFound:  # forgotten meanwhile
                    continue
        if removed:
            log.info("swept %d expired memories", removed)
        self.last_sweep = (now, removed)
        return removed

    def start_sweeper(self, every_seconds: float) -> None:
        self.sweep_every = every_seconds
        def loop() -> None:
            while not self._stop.wait(every_seconds):
                try:
                    self.sweep()
                except RagplaneError as exc:  # a full or read-only disk: try again next round
                    log.warning("memory sweep failed, retried in %.0f s: %s", every_seconds, exc)
                except Exception:  # keep sweeping; a bug here must not kill the thread
                    log.exception("memory sweep failed")

        self._sweeper = threading.Thread(target=loop, name="memory-sweeper", daemon=True)
        self._sweeper.start()

    def namespaces(self) -> list[CollectionInfo]:
        """The caller's namespaces (their `count`: memories, expired ones not yet swept)."""
        return self._store.list_collections(self._space())

    def count(self) -> int:
        return sum(i.count for i in self._store.list_all_collections())

    def close(self) -> None:
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(5)


def _record(mid: str, vec: Any, spans: list[Span], text: str, md: dict[str, Any]) -> Record:
    return Record(mid, None, text, md, chunks=spans) if spans else Record(mid, vec, text, md)
