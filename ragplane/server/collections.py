"""Collections as the service sees them: the index engine plus server-side embedding,
tenancy and the embedder-identity check.

Every collection records the embedder (name@version) whose vectors it holds. Text that
is embedded for it (on upsert or as a query) must come from that embedder, unless the
shadow says the two agree (G1) — otherwise the call is refused with FAILED_PRECONDITION
naming both, and a rebuild with re-embedding is the way forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.index import Engine
from ragplane.index.fusion import check as check_fusion
from ragplane.index.types import (
    CollectionInfo,
    Filter,
    Fusion,
    IndexParams,
    IndexType,
    Metric,
    Record,
    SearchMode,
    SearchResult,
)
from ragplane.index.validate import check_top_k, query_vectors
from ragplane.server import auth
from ragplane.server.embedding.service import EmbeddingService
from ragplane.server.search_batcher import SearchCoalescer

Compatible = Callable[[str, str], bool]


class CollectionService:
    def __init__(
        self,
        engine: Engine,
        embedding: EmbeddingService,
        *,
        max_batch_items: int = 2048,
        compatible: Compatible | None = None,
        search_max_batch: int = 64,
    ) -> None:
        self.engine = engine
        self.embedding = embedding
        self.max_batch_items = max_batch_items
        self._compatible = compatible or (lambda a, b: a == b)
        self.searches = SearchCoalescer(engine, max_batch=search_max_batch)

    @staticmethod
    def _tenant() -> str:
        return auth.current.get().tenant

    def set_compatibility(self, compatible: Compatible) -> None:
        self._compatible = compatible

    def create(
        self,
        name: str,
        *,
        metric: Metric,
        index_type: IndexType,
        dim: int,
        params: IndexParams,
        lexical_index: bool = True,
    ) -> CollectionInfo:
        embedder = self.embedding.serving_embedder()
        if dim < 0:
            raise InvalidArgument(
                f"dim must be >= 0 (0 = the embedder's {embedder.dim}), got {dim}"
            )
        # A collection of another dimension can only hold vectors its callers bring.
        identity = embedder.identity if dim in (0, embedder.dim) else ""
        return self.engine.create_collection(
            self._tenant(),
            name,
            dim=dim or embedder.dim,
            metric=metric,
            index_type=index_type,
            embedder=identity,
            params=params,
            lexical_index=lexical_index,
        )

    def delete_collection(self, name: str) -> None:
        self.engine.delete_collection(self._tenant(), name)

    def list(self) -> list[CollectionInfo]:
        return self.engine.list_collections(self._tenant())

    def describe(self, name: str) -> CollectionInfo:
        return self.engine.describe(self._tenant(), name)

    def _embedder_for(self, info: CollectionInfo, what: str):
        embedder = self.embedding.serving_embedder()
        if not info.embedder:
            raise InvalidArgument(
                f"collection {info.name!r} holds {info.dim}-dim vectors from callers, not from "
                f"an embedder; send vectors instead of {what}"
            )
        if info.embedder != embedder.identity and not self._compatible(
            info.embedder, embedder.identity
        ):
            raise FailedPrecondition(
                f"collection {info.name!r} holds vectors of {info.embedder}, but {what} would be "
                f"embedded by {embedder.identity}, and that pair has not passed the agreement "
                f"gate (G1); rebuild the collection with --reembed, or send vectors"
            )
        return embedder

    def upsert(
        self, name: str, records: Sequence[Record], *, is_active: Callable[[], bool] = lambda: True
    ) -> tuple[int, str]:
        if not records:
            raise InvalidArgument("items is empty; send at least one item")
        if len(records) > self.max_batch_items:
            raise InvalidArgument(
                f"{len(records)} items in one request; the limit is {self.max_batch_items}"
            )
        tenant = self._tenant()
        to_embed = [i for i, r in enumerate(records) if r.vector is None]
        identity = ""
        if to_embed:
            info = self.engine.describe(tenant, name)
            for i in to_embed:
                if not records[i].text.strip():
                    raise InvalidArgument(
                        f"items[{i}] (id {records[i].id!r}) has neither a vector nor text"
                    )
            self._embedder_for(info, "item text")
            result = self.embedding.embed([records[i].text for i in to_embed], is_active=is_active)
            identity = result.embedder
            records = list(records)
            for row, i in enumerate(to_embed):
                records[i] = replace(records[i], vector=result.vectors[row])
        return self.engine.upsert(tenant, name, records), identity

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
    ) -> tuple[SearchResult, str]:
        tenant = self._tenant()
        identity = ""
        if text is None and vector is None:
            raise InvalidArgument("Search needs a query: set text or vector")
        check_top_k(top_k)
        if mode is not SearchMode.DENSE:
            return self._search_text(
                tenant, name, text, top_k, filter, include_text, include_metadata, mode, fusion,
                is_active,
            )
        info = self.engine.describe(tenant, name)
        if text is not None:
            if not text.strip():
                raise InvalidArgument("query text is empty")
            self._embedder_for(info, "the query text")
            result = self.embedding.embed([text], is_active=is_active)
            vector, identity = result.vectors[0], result.embedder
        assert vector is not None
        if vector.ndim != 1:
            raise InvalidArgument(f"query vector must be one vector, got shape {vector.shape}")
        # checked here, not only in the engine: a bad query must fail alone, before the
        # coalescer batches it with other callers' searches
        query_vectors(vector, info.dim, info.metric, name)
        res = self.searches.search(
            tenant,
            name,
            vector,
            top_k,
            filter=filter,
            include_text=include_text,
            include_metadata=include_metadata,
        )
        return res, identity

    def _search_text(
        self,
        tenant: str,
        name: str,
        text: str | None,
        top_k: int,
        filter: Filter | None,
        include_text: bool,
        include_metadata: bool,
        mode: SearchMode,
        fusion: Fusion,
        is_active: Callable[[], bool],
    ) -> tuple[SearchResult, str]:
        """LEXICAL (no embedding at all) and HYBRID searches, which need the query's text."""
        if text is None:
            raise InvalidArgument(
                f"{mode.value} search ranks by the query's words: send text, not a vector "
                "(vector queries search in dense mode)"
            )
        if not text.strip():
            raise InvalidArgument("query text is empty")
        options = {"filter": filter, "include_text": include_text,
                   "include_metadata": include_metadata}
        if mode is SearchMode.LEXICAL:
            return self.engine.search_lexical(tenant, name, text, top_k, **options), ""
        check_fusion(fusion)  # before the embedding is paid for
        self._embedder_for(self.engine.describe(tenant, name), "the query text")
        result = self.embedding.embed([text], is_active=is_active)
        res = self.engine.search_hybrid(
            tenant, name, text, result.vectors[0], top_k, fusion=fusion, **options
        )
        return res, result.embedder
