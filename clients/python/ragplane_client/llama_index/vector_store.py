"""`RagplaneVectorStore`: a LlamaIndex vector store over a ragplane collection.

    from llama_index.core import VectorStoreIndex
    from ragplane_client.llama_index import RagplaneVectorStore

    store = RagplaneVectorStore("docs", target="127.0.0.1:50051")
    index = VectorStoreIndex.from_vector_store(store)

Vectors are LlamaIndex's (its embed model's); the collection is made on the first add with
their dimension, cosine, and no server-side chunking (LlamaIndex splits the text). How
nodes are stored: see `_nodes`; how filters map: see `ragplane_client.llama_index.filters`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)

from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client
from ragplane_client.llama_index import _nodes
from ragplane_client.llama_index.filters import to_filter
from ragplane_client.types import SearchResult


class RagplaneVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store backed by the ragplane collection `collection_name`.

    Connect with `target` ("host:port": the store opens, owns and closes a Client and an
    AsyncClient) or with your own `client` (blocking methods) and/or `aclient` (the async
    twins). collection_options: more create_collection options for the collection it makes
    (default metric "cosine", chunking off, dim from the first embeddings); a collection
    that exists already is used as it is.

    Query modes: default (dense, by the query embedding), text_search and sparse (BM25 by
    query_str; top_k = sparse_top_k or similarity_top_k), hybrid (the server's fusion
    `hybrid_fusion` of dense and BM25 rankings, `alpha` as the dense weight, top_k =
    hybrid_top_k or similarity_top_k). Hybrid ranks by the server's embedding of query_str,
    so it needs a collection whose vectors come from the server's embedder (embed with
    RagplaneEmbedding). Other modes (mmr, svm, ...) raise ValueError.

    A missing collection reads as empty (query, get_nodes) and deletes nothing.
    """

    stores_text: bool = True
    flat_metadata: bool = False
    collection_name: str
    hybrid_fusion: str = Field(default="weighted", description='"weighted" or "rrf"')
    batch_size: int = 256
    collection_options: dict[str, Any] = Field(default_factory=dict)

    _client: Client | None = PrivateAttr(default=None)
    _aclient: AsyncClient | None = PrivateAttr(default=None)
    _owns_clients: bool = PrivateAttr(default=False)
    _exists: bool = PrivateAttr(default=False)

    def __init__(
        self,
        collection_name: str,
        *,
        target: str | None = None,
        client: Client | None = None,
        aclient: AsyncClient | None = None,
        hybrid_fusion: str = "weighted",
        batch_size: int = 256,
        collection_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if target is not None and (client is not None or aclient is not None):
            raise ValueError("pass target= or client= / aclient=, not both")
        if target is None and client is None and aclient is None:
            raise ValueError("pass target='host:port', or client= and/or aclient=")
        if hybrid_fusion not in ("weighted", "rrf"):
            raise ValueError(f"hybrid_fusion is 'weighted' or 'rrf', got {hybrid_fusion!r}")
        super().__init__(
            collection_name=collection_name, hybrid_fusion=hybrid_fusion, batch_size=batch_size,
            collection_options=dict(collection_options or {}), **kwargs,
        )  # fmt: skip
        if target is not None:
            client, aclient = Client(target), AsyncClient(target)
            self._owns_clients = True
        self._client, self._aclient = client, aclient

    @classmethod
    def class_name(cls) -> str:
        return "RagplaneVectorStore"

    @property
    def client(self) -> Client | None:
        return self._client

    @property
    def aclient(self) -> AsyncClient | None:
        return self._aclient

    def close(self) -> None:
        """Close the blocking client, when the store opened it (target=)."""
        if self._owns_clients and self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Close both clients, when the store opened them (target=)."""
        self.close()
        if self._owns_clients and self._aclient is not None:
            await self._aclient.close()

    def _sync(self) -> Client:
        if self._client is None:
            raise ValueError("this store was made with aclient= only: use the async methods")
        return self._client

    def _async(self) -> AsyncClient:
        if self._aclient is None:
            raise ValueError("this store was made with client= only: use the blocking methods")
        return self._aclient

    def _create_options(self, dim: int) -> dict[str, Any]:
        return {"dim": dim, "metric": "cosine", "chunking": False, **self.collection_options}

    # --- blocking ------------------------------------------------------------------------

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Upsert the nodes (ids = node_id) with their embeddings; returns their ids."""
        items = [_nodes.to_item(n) for n in nodes]
        if not items:
            return []
        c = self._sync()
        if not self._exists:
            try:
                c.create_collection(
                    self.collection_name, **self._create_options(len(items[0]["vector"]))
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
            self._exists = True
        c.upsert(self.collection_name, items, batch_size=self.batch_size)
        return [it["id"] for it in items]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the document `ref_doc_id`."""
        with _absent_ok():
            self._sync().delete(self.collection_name, filter=_ref_doc(ref_doc_id))

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        s = _nodes.plan_query(query, self.hybrid_fusion)
        res = _EMPTY
        with _absent_ok(), _text_query_refused(s):
            res = self._sync().search(self.collection_name, s.query, **s.options)
        return _nodes.query_result(res)

    def get_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None
    ) -> list[BaseNode]:
        """The nodes with these ids and/or matching these filters (all nodes when neither),
        with their embeddings. Filters alone read at most 10,000 nodes (ValueError past it)."""
        if node_ids is not None and not node_ids:
            return []
        c, name, items = self._sync(), self.collection_name, []
        with _absent_ok():
            ids = node_ids
            if filters is not None or node_ids is None:
                info = c.describe_collection(name)
                s = _nodes.scan(info.dim, info.count, _nodes.id_filter(node_ids, filters), node_ids)
                res = c.search(name, s.query, **s.options) if s else _EMPTY
                ids = _nodes.scanned_ids(res, info.count)
            items = c.get(name, ids, include_vectors=True) if ids else []
        return _nodes.nodes_of_items(items)

    def delete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        """Delete the nodes with these ids and/or matching these filters (one of them is
        needed: `clear()` deletes everything)."""
        ids, flt = _delete_selector(node_ids, filters)
        if ids is None and flt is None:
            return
        with _absent_ok():
            self._sync().delete(self.collection_name, ids, filter=flt)

    def clear(self) -> None:
        """Delete the collection; the next add makes it again."""
        self._sync().delete_collection(self.collection_name)
        self._exists = False

    # --- async ---------------------------------------------------------------------------

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        items = [_nodes.to_item(n) for n in nodes]
        if not items:
            return []
        c = self._async()
        if not self._exists:
            try:
                await c.create_collection(
                    self.collection_name, **self._create_options(len(items[0]["vector"]))
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
            self._exists = True
        await c.upsert(self.collection_name, items, batch_size=self.batch_size)
        return [it["id"] for it in items]

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        with _absent_ok():
            await self._async().delete(self.collection_name, filter=_ref_doc(ref_doc_id))

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        s = _nodes.plan_query(query, self.hybrid_fusion)
        res = _EMPTY
        with _absent_ok(), _text_query_refused(s):
            res = await self._async().search(self.collection_name, s.query, **s.options)
        return _nodes.query_result(res)

    async def aget_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None
    ) -> list[BaseNode]:
        if node_ids is not None and not node_ids:
            return []
        c, name, items = self._async(), self.collection_name, []
        with _absent_ok():
            ids = node_ids
            if filters is not None or node_ids is None:
                info = await c.describe_collection(name)
                s = _nodes.scan(info.dim, info.count, _nodes.id_filter(node_ids, filters), node_ids)
                res = await c.search(name, s.query, **s.options) if s else _EMPTY
                ids = _nodes.scanned_ids(res, info.count)
            items = await c.get(name, ids, include_vectors=True) if ids else []
        return _nodes.nodes_of_items(items)

    async def adelete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        ids, flt = _delete_selector(node_ids, filters)
        if ids is None and flt is None:
            return
        with _absent_ok():
            await self._async().delete(self.collection_name, ids, filter=flt)

    async def aclear(self) -> None:
        await self._async().delete_collection(self.collection_name)
        self._exists = False


_EMPTY = SearchResult(hits=())


def _ref_doc(ref_doc_id: str) -> dict[str, Any] | None:
    return to_filter(None, {"field": _nodes.REF_DOC_ID_KEY, "op": "eq", "value": ref_doc_id})


def _delete_selector(
    node_ids: list[str] | None, filters: MetadataFilters | None
) -> tuple[list[str] | None, dict[str, Any] | None]:
    """(ids, filter) of a delete_nodes call; (None, None) when it selects nothing."""
    if node_ids is None and filters is None:
        raise ValueError("delete_nodes needs node_ids or filters; clear() deletes every node")
    if node_ids is not None and not node_ids:
        return None, None
    if filters is None:
        return list(node_ids or ()), None
    return None, _nodes.id_filter(node_ids, filters)


class _absent_ok:
    """Swallows NOT_FOUND of a missing collection: it holds no nodes."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> bool:
        return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.NOT_FOUND


class _text_query_refused:
    """A hybrid query the server cannot embed for this collection (its vectors came from
    callers, or from another embedder) as a ValueError that says what to do."""

    def __init__(self, s: _nodes.Search) -> None:
        self.mode = s.options["mode"]

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> bool:
        if (
            self.mode == "hybrid"
            and isinstance(exc, grpc.RpcError)
            and exc.code()
            in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
            and "embedder" in (exc.details() or "")
        ):
            raise ValueError(
                "hybrid queries rank by the server's embedding of query_str, and this "
                "collection's vectors are not the server embedder's; embed with "
                f"RagplaneEmbedding to use hybrid mode (server: {exc.details()})"
            ) from exc
        return False
