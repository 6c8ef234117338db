"""Collections as the service sees them: the index engine plus server-side embedding,
tenancy and the embedder-identity check.

Every collection records the embedder (name@version) whose vectors it holds. Text that
is embedded for it (on upsert or as a query) must come from that embedder, unless the
shadow says the two agree (G1) — otherwise the call is refused with FAILED_PRECONDITION
naming both, and a rebuild with re-embedding is the way forward. The check, chunking and
embedding are `embedded_items.py`'s, shared with memory namespaces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ragplane.core.errors import AlreadyExists, InvalidArgument
from ragplane.index.backend import Store
from ragplane.index.fusion import check as check_fusion
from ragplane.index.types import (
    Chunking,
    CollectionInfo,
    Filter,
    Fusion,
    IndexParams,
    IndexType,
    Metric,
    Record,
    SearchKnobs,
    SearchMode,
    SearchResult,
)
from ragplane.index.validate import check_top_k, query_vectors
from ragplane.server import auth, chunking, groups
from ragplane.server.embedded_items import Compatible, ItemEmbedding
from ragplane.server.embedding.base import Embedder
from ragplane.server.embedding.service import EmbeddingService
from ragplane.server.search_batcher import SearchCoalescer


@dataclass(frozen=True)
class Written:
    """What an Upsert wrote: items, chunks (vectors), texts embedded truncated (chunking
    off), and the embedder of the text embedded ('' when all came with vectors)."""

    items: int
    chunks: int
    truncated: int
    embedder: str


@dataclass(frozen=True)
class Grouping:
    """SearchRequest's group_by, group_size and group_limit (field '' = no groups)."""

    field: str = ""
    size: int = 0
    limit: int = 0


class CollectionService:
    def __init__(
        self,
        engine: Store,
        embedding: EmbeddingService,
        *,
        max_batch_items: int = 2048,
        compatible: Compatible | None = None,
        search_max_batch: int = 64,
        search_coalesce_min_vectors: int = 0,
        max_item_text_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.engine = engine
        self.embedding = embedding
        self.max_batch_items = max_batch_items
        self.max_item_text_bytes = max_item_text_bytes
        self.embedded = ItemEmbedding(embedding, compatible)
        self.searches = SearchCoalescer(
            engine, max_batch=search_max_batch, min_vectors=search_coalesce_min_vectors
        )

    @staticmethod
    def _tenant() -> str:
        return auth.current.get().tenant

    def set_compatibility(self, compatible: Compatible) -> None:
        self.embedded.set_compatibility(compatible)

    def create(
        self,
        name: str,
        *,
        metric: Metric,
        index_type: IndexType,
        dim: int,
        params: IndexParams,
        lexical_index: bool = True,
        chunks: Chunking | None = None,
        exist_ok: bool = False,
    ) -> CollectionInfo:
        """`chunks`: None = on, at the embedder's window (only for a collection whose text
        the embedder embeds; one that holds callers' vectors has no chunking). `exist_ok`:
        get-or-create, the existing collection when it is the one asked for (`_same`)."""
        embedder = self.embedding.serving_embedder()
        if dim < 0:
            raise InvalidArgument(
                f"dim must be >= 0 (0 = the embedder's {embedder.dim}), got {dim}"
            )
        # A collection of another dimension can only hold vectors its callers bring.
        identity = embedder.identity if dim in (0, embedder.dim) else ""
        if not identity and chunks is not None and chunks.enabled:
            raise InvalidArgument(
                f"chunking needs the embedder's vectors, but a {dim}-dim collection holds "
                f"vectors from callers (the embedder's are {embedder.dim}-dim); set dim to 0 "
                "or chunking.enabled to false"
            )
        asked = {
            "dim": dim or embedder.dim,
            "metric": metric,
            "index_type": index_type,
            "embedder": identity,
            "params": params,
            "lexical_index": lexical_index,
            "chunking": chunking.resolve(chunks, embedder.max_seq_length) if identity
            else Chunking(),
        }
        try:
            return self.engine.create_collection(self._tenant(), name, **asked)
        except AlreadyExists:
            if not exist_ok:
                raise
        # the embedder is the server's choice, not the caller's (a rebuild may change it)
        return _same(self.describe(name), {k: v for k, v in asked.items() if k != "embedder"})

    def delete_collection(self, name: str) -> None:
        self.engine.delete_collection(self._tenant(), name)

    def list(self) -> list[CollectionInfo]:
        return self.engine.list_collections(self._tenant())

    def describe(self, name: str) -> CollectionInfo:
        return self.engine.describe(self._tenant(), name)

    def _embedder_for(self, info: CollectionInfo, what: str) -> Embedder:
        if not info.embedder:
            raise InvalidArgument(
                f"collection {info.name!r} holds {info.dim}-dim vectors from callers, not from "
                f"an embedder; send vectors instead of {what}"
            )
        return self.embedded.embedder_for(
            info.embedder, f"collection {info.name!r}", what,
            "rebuild the collection with --reembed, or send vectors",
        )

    def upsert(
        self, name: str, records: Sequence[Record], *, is_active: Callable[[], bool] = lambda: True
    ) -> Written:
        """Write `records`; those without a vector are embedded here: chunked first when the
        collection chunks (each chunk embedded alone), else embedded truncated."""
        if not records:
            raise InvalidArgument("items is empty; send at least one item")
        if len(records) > self.max_batch_items:
            raise InvalidArgument(
                f"{len(records)} items in one request; the limit is {self.max_batch_items}"
            )
        self._check_sizes(records)
        tenant = self._tenant()
        to_embed = [i for i, r in enumerate(records) if r.vector is None]
        if not to_embed:
            n = self.engine.upsert(tenant, name, records)
            return Written(n, n, 0, "")
        info = self.engine.describe(tenant, name)
        for i in to_embed:
            if not records[i].text.strip():
                raise InvalidArgument(
                    f"items[{i}] (id {records[i].id!r}) has neither a vector nor text"
                )
        embedder = self._embedder_for(info, "item text")
        texts = [records[i].text for i in to_embed]
        records = list(records)
        if info.chunking.enabled:
            chunking.check_window(info.chunking, embedder, name)
            spans, identity = self.embedded.chunks(texts, info.chunking, embedder, is_active)
            for i, chunks in zip(to_embed, spans, strict=True):
                records[i] = replace(records[i], chunks=chunks)
            truncated = 0
            n_chunks = len(records) - len(to_embed) + sum(len(sp) for sp in spans)
        else:
            truncated = chunking.chunker_for(embedder).truncated(texts, embedder.max_seq_length)
            # past the window nothing is embedded: a prefix keeps Embed's byte limit
            head = self.embedding.max_text_bytes // 4
            vectors, identity = self.embedded.embed_all([t[:head] for t in texts], is_active)
            for row, i in enumerate(to_embed):
                records[i] = replace(records[i], vector=vectors[row])
            n_chunks = len(records)
        return Written(self.engine.upsert(tenant, name, records), n_chunks, truncated, identity)

    def _check_sizes(self, records: Sequence[Record]) -> None:
        for i, r in enumerate(records):
            if len(r.text) * 4 > self.max_item_text_bytes:  # only long texts pay for encoding
                size = len(r.text.encode("utf-8", "surrogatepass"))
                if size > self.max_item_text_bytes:
                    raise InvalidArgument(
                        f"items[{i}] (id {r.id!r}) text is {size} bytes; the limit is "
                        f"{self.max_item_text_bytes} bytes (max_item_text_bytes); split the "
                        "document into several items"
                    )

    def items(self, name: str, *, page: int, page_size: int) -> tuple[list[Record], bool]:
        """Page `page` (from 0) of the collection's live items in write order, without
        vectors, and whether a later page has any; page N reads the N before it (the
        operator's console browses the first pages, where that costs little)."""
        if page < 0 or not 0 < page_size <= 1000:
            raise InvalidArgument(f"page must be >= 0 and page_size in 1..1000, got {page}, "
                                  f"{page_size}")
        batches = self.engine.iter_records(self._tenant(), name, batch=page_size)
        for _ in range(page):
            if next(batches, None) is None:
                return [], False
        rows = next(batches, [])
        more = next(batches, None) is not None if len(rows) == page_size else False
        return [replace(r, vector=None) for r in rows], more

    def get(self, name: str, ids: Sequence[str], *, include_vectors: bool) -> list[Record]:
        if not ids:
            raise InvalidArgument("ids is empty; name at least one id")
        return self.engine.get(self._tenant(), name, ids, include_vectors=include_vectors)

    def delete(self, name: str, *, ids: Sequence[str] | None, filter: Filter | None) -> int:
        if ids is None and filter is None:
            raise InvalidArgument(
                "Delete needs ids or a non-empty filter; an empty filter never deletes everything "
                "(use DeleteCollection for that)"
            )
        if ids is not None and not ids:
            raise InvalidArgument("ids is empty; name at least one id")
        return self.engine.delete(self._tenant(), name, ids=ids, filter=filter)

    def search(
        self,
        name: str,
        *,
        text: str | None,
        vector: np.ndarray | None,
        top_k: int,
        filter: Filter | None,
        include_text: bool,
        include_metadata: bool,
        mode: SearchMode = SearchMode.DENSE,
        fusion: Fusion = Fusion(),  # noqa: B008 - frozen
        is_active: Callable[[], bool] = lambda: True,
        chunks_per_hit: int = 1,
        grouping: Grouping = Grouping(),  # noqa: B008 - frozen
        knobs: SearchKnobs | None = None,
    ) -> tuple[SearchResult, str]:
        """`knobs`: the dense search's parameters for this request (None = the collection's)."""
        tenant = self._tenant()
        if text is None and vector is None:
            raise InvalidArgument("Search needs a query: set text or vector")
        check_top_k(top_k)
        if knobs not in (None, SearchKnobs()) and mode is not SearchMode.DENSE:
            raise InvalidArgument(
                f"params (ef_search, nprobe, exact, oversampling) apply to dense search; "
                f"{mode.value} search takes the collection's own"
            )
        if mode is not SearchMode.DENSE:
            self._check_text_query(text, mode)
        elif text is not None and not text.strip():
            raise InvalidArgument("query text is empty")
        if mode is SearchMode.HYBRID:
            check_fusion(fusion)  # before the embedding is paid for
        identity = ""
        info = None  # described only where needed: a plain vector search is served most
        if text is not None and mode is not SearchMode.LEXICAL:
            info = self.engine.describe(tenant, name)
            self._embedder_for(info, "the query text")
            result = self.embedding.embed([text], is_active=is_active)
            vector, identity = result.vectors[0], result.embedder
        assert vector is not None or mode is SearchMode.LEXICAL
        vectors = 0
        if mode is SearchMode.DENSE:
            vectors = self.engine.scan_size(tenant, name)  # NotFound first, as ever
            if vector.ndim != 1:
                raise InvalidArgument(f"query vector must be one vector, got shape {vector.shape}")
            if self.searches.coalesces(vectors):
                # checked here, not only in the engine: a bad query must fail alone, before
                # the coalescer batches it with other callers' searches
                if info is None:
                    info = self.engine.describe(tenant, name)
                query_vectors(vector, info.dim, info.metric, name)
        options = {"filter": filter, "include_text": include_text,
                   "chunks_per_hit": chunks_per_hit}

        def run(k: int, with_metadata: bool = include_metadata) -> SearchResult:
            if mode is SearchMode.LEXICAL:
                return self.engine.search_lexical(
                    tenant, name, text, k, include_metadata=with_metadata, **options)
            if mode is SearchMode.HYBRID:
                return self.engine.search_hybrid(
                    tenant, name, text, vector, k, fusion=fusion,
                    include_metadata=with_metadata, **options)
            return self.searches.search(
                tenant, name, vector, k, include_metadata=with_metadata, knobs=knobs,
                vectors=vectors, **options)

        if grouping.field:
            res = groups.search_groups(
                lambda k: run(k, True), grouping.field, grouping.size, grouping.limit, top_k,
                include_metadata,
            )
            return res, identity
        return run(top_k), identity

    @staticmethod
    def _check_text_query(text: str | None, mode: SearchMode) -> None:
        """LEXICAL and HYBRID searches rank by the query's words: they need its text."""
        if text is None:
            raise InvalidArgument(
                f"{mode.value} search ranks by the query's words: send text, not a vector "
                "(vector queries search in dense mode)"
            )
        if not text.strip():
            raise InvalidArgument("query text is empty")


def _same(info: CollectionInfo, asked: dict) -> CollectionInfo:
    """`info` (the collection that holds the name) when it has every setting `asked` for;
    AlreadyExists naming the first that differs otherwise, so get-or-create never hands a
    caller a collection other than the one it asked for."""
    for key, want in asked.items():
        have = getattr(info, key)
        if key == "params":  # reported resolved, and the quantization that serves (float
            # until a rebuild trains int8): the numbers asked for (0 = the default)
            if all(getattr(have, f) == v for f, v in vars(want).items()
                   if v and f != "quantization"):
                continue
        elif have == want:
            continue
        raise AlreadyExists(
            f"collection {info.name!r} already exists with {key} {have!r}, not {want!r}; "
            "pick another name or delete it first"
        )
    return info
