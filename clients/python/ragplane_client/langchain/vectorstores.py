"""`RagplaneVectorStore`: a LangChain VectorStore over one ragplane collection."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client
from ragplane_client.langchain import _steps as st
from ragplane_client.langchain._connect import Connection
from ragplane_client.langchain.embeddings import RagplaneEmbeddings


class RagplaneVectorStore(VectorStore):
    """Documents in a ragplane collection, with vectors from any LangChain embedding.

        store = RagplaneVectorStore("docs", embedding, target="127.0.0.1:50051")
        store.add_texts(["sqlite is the source of truth"], [{"year": 2024}])
        store.similarity_search("where is data kept?", k=4, filter={"year": 2024})

    The store embeds texts itself (`embedding.embed_documents` / `embed_query`) and sends
    vectors, so an embedding of any size works. The collection is created on the first
    write, with the embedding's dimension, `metric` and `index_type` (chunking off: one
    document, one vector); an existing one is used as it is.

    target: "host:port" (or a list: round-robin), with **client_options passed to Client
        and AsyncClient (api_key, tls, root_certificates, timeout, retry, ...); or client=
        for the sync methods and async_client= for the async ones (native: they run over
        grpc.aio, one AsyncClient per event loop when made from target).
    mode: the default search mode, "dense", "lexical" (BM25 on the text) or "hybrid";
        each search may pass mode= (e.g. `as_retriever(search_kwargs={"mode": "hybrid"})`).
        Hybrid runs on the server when `embedding` is a RagplaneEmbeddings of the default
        use case (the server embeds the query with the same embedder); with any other
        embedding the store fuses a dense and a lexical search itself, by RRF.

    Searches take filter= as {"field": value, "n": {"$gte": 2}, "tag": ["a", "b"]} (every
    entry must hold: eq, an operator, in) or the client's form with must / should /
    must_not (see ragplane_client.filters), and fusion=, rrf_k=, dense_weight=, timeout=.
    Scores are higher-is-better: the cosine similarity in dense mode (for metric
    "cosine"), BM25 in lexical mode, the fused score in hybrid.

    Metadata keeps its types (int, float, bool, str, None, lists, nested dicts): whole
    floats are marked under the reserved key "_ragplane_floats", as the wire keeps every
    number as a double. Tuples come back as lists; ints beyond 2**53 lose precision.
    """

    def __init__(
        self,
        collection_name: str,
        embedding: Embeddings,
        *,
        target: str | list[str] | None = None,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        mode: str = "dense",
        metric: str = "cosine",
        index_type: str = "flat",
        **client_options: Any,
    ) -> None:
        if mode not in st.MODES:
            raise ValueError(f"unknown search mode {mode!r}; use one of {st.MODES}")
        self.collection_name = collection_name
        self.embedding = embedding
        self.mode = mode
        self.metric = metric
        self._conn = Connection(
            target, client=client, async_client=async_client, client_options=client_options
        )
        self._spec = st.Spec(
            collection=collection_name,
            create={"metric": metric, "index_type": index_type, "chunking": False},
            mode=mode,
            server_embeds_queries=isinstance(embedding, RagplaneEmbeddings)
            and embedding.serves_default_use_case,
        )

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    def _run(self, steps: st.Steps[Any]) -> Any:
        return st.run(steps, self._conn.sync, self.embedding)

    async def _arun(self, steps: st.Steps[Any]) -> Any:
        return await st.arun(steps, lambda: self._conn.aio, self.embedding)

    def close(self) -> None:
        """Close the blocking client made from `target` (see also `aclose`)."""
        self._conn.close()

    async def aclose(self) -> None:
        """Close the running event loop's AsyncClient made from `target`."""
        await self._conn.aclose()

    # --- writes ------------------------------------------------------------------------

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and upsert the texts (an id already there is replaced); returns their ids,
        new UUIDs where none is given."""
        return self._run(st.add(self._spec, list(texts), metadatas, ids))

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        return await self._arun(st.add(self._spec, list(texts), metadatas, ids))

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """As add_texts; ids= wins over each Document.id (a document without one gets a
        new UUID)."""
        ids = kwargs.pop("ids", None) or [d.id for d in documents]
        texts = [d.page_content for d in documents]
        return self.add_texts(texts, [d.metadata for d in documents], ids=ids, **kwargs)

    async def aadd_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        ids = kwargs.pop("ids", None) or [d.id for d in documents]
        texts = [d.page_content for d in documents]
        return await self.aadd_texts(texts, [d.metadata for d in documents], ids=ids, **kwargs)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete by ids, by filter= (as in searches), or everything (neither: the
        collection is dropped and made again by the next write). Missing ids are fine."""
        return self._run(st.delete(self._spec, ids, kwargs.get("filter")))

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        return await self._arun(st.delete(self._spec, ids, kwargs.get("filter")))

    # --- reads -------------------------------------------------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents found, in the order of `ids` (missing ones left out)."""
        return self._run(st.get_by_ids(self._spec, ids))

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return await self._arun(st.get_by_ids(self._spec, ids))

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The k best documents with their scores (higher is better), in `mode` (see the
        class); kwargs: mode, fetch_k (client-side hybrid), fusion, rrf_k, dense_weight,
        timeout."""
        return self._run(st.search(self._spec, query, k, filter, kwargs))

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return await self._arun(st.search(self._spec, query, k, filter, kwargs))

    def similarity_search(
        self, query: str, k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    async def asimilarity_search(
        self, query: str, k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[Document]:
        found = await self.asimilarity_search_with_score(query, k, filter, **kwargs)
        return [d for d, _ in found]

    def similarity_search_by_vector_with_score(
        self, embedding: list[float], k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self._run(st.search_by_vector(self._spec, embedding, k, filter, kwargs))

    async def asimilarity_search_by_vector_with_score(
        self, embedding: list[float], k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return await self._arun(st.search_by_vector(self._spec, embedding, k, filter, kwargs))

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[Document]:
        found = self.similarity_search_by_vector_with_score(embedding, k, filter, **kwargs)
        return [d for d, _ in found]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: Any = None, **kwargs: Any
    ) -> list[Document]:
        found = await self.asimilarity_search_by_vector_with_score(embedding, k, filter, **kwargs)
        return [d for d, _ in found]

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Any = None,
        **kwargs: Any,
    ) -> list[Document]:
        """k documents picked for relevance and diversity among the fetch_k nearest: their
        stored vectors are read back (Get with include_vectors), not re-embedded."""
        return self._run(st.mmr(self._spec, query, k, fetch_k, lambda_mult, filter, kwargs))

    async def amax_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Any = None,
        **kwargs: Any,
    ) -> list[Document]:
        steps = st.mmr(self._spec, query, k, fetch_k, lambda_mult, filter, kwargs)
        return await self._arun(steps)

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Any = None,
        **kwargs: Any,
    ) -> list[Document]:
        return self._run(st.mmr(self._spec, embedding, k, fetch_k, lambda_mult, filter, kwargs))

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Any = None,
        **kwargs: Any,
    ) -> list[Document]:
        steps = st.mmr(self._spec, embedding, k, fetch_k, lambda_mult, filter, kwargs)
        return await self._arun(steps)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Dense scores onto [0, 1] for similarity_search_with_relevance_scores: cosine
        (or inner product of normalised vectors) s as (1 + s) / 2; "l2" (the server's
        -squared distance) as 1 - distance / sqrt(2), for normalised vectors. Lexical and
        hybrid scores are on other scales: use similarity_search_with_score there."""
        if self.metric == "l2":
            return lambda s: 1.0 - math.sqrt(max(-s, 0.0)) / math.sqrt(2)
        return lambda s: (1.0 + s) / 2.0

    # --- construction ------------------------------------------------------------------

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        collection_name: str = "langchain",
        **kwargs: Any,
    ) -> RagplaneVectorStore:
        """A store (kwargs: the constructor's, e.g. target=) with the texts added."""
        store = cls(collection_name, embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        collection_name: str = "langchain",
        **kwargs: Any,
    ) -> RagplaneVectorStore:
        store = cls(collection_name, embedding, **kwargs)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store
