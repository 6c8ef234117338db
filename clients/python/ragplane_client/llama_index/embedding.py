"""`RagplaneEmbedding`: LlamaIndex embeddings from a ragplane server's embedder.

With it, the vectors LlamaIndex stores are the server's own, so hybrid queries (which the
server embeds from query_str) compare like with like, and text never leaves for a
third-party API.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client


class RagplaneEmbedding(BaseEmbedding):
    """Embeds with the server's embedder of `use_case` ("" = "embeddings"), normalised.

    Connect with `target` ("host:port"; the embedding opens its own clients) or with
    `client` and/or `aclient`, as RagplaneVectorStore. `embed_batch_size` texts go in one
    Embed call (the server's own limit, max_batch_texts, may be lower)."""

    model_name: str = Field(default="ragplane", description="name LlamaIndex reports")
    use_case: str = ""

    _client: Client | None = PrivateAttr(default=None)
    _aclient: AsyncClient | None = PrivateAttr(default=None)
    _owns_clients: bool = PrivateAttr(default=False)

    def __init__(
        self,
        *,
        target: str | None = None,
        client: Client | None = None,
        aclient: AsyncClient | None = None,
        use_case: str = "",
        **kwargs: Any,
    ) -> None:
        if target is not None and (client is not None or aclient is not None):
            raise ValueError("pass target= or client= / aclient=, not both")
        if target is None and client is None and aclient is None:
            raise ValueError("pass target='host:port', or client= and/or aclient=")
        super().__init__(use_case=use_case, **kwargs)
        if target is not None:
            client, aclient = Client(target), AsyncClient(target)
            self._owns_clients = True
        self._client, self._aclient = client, aclient

    def close(self) -> None:
        """Close the blocking client, when the embedding opened it (target=)."""
        if self._owns_clients and self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Close both clients, when the embedding opened them (target=)."""
        self.close()
        if self._owns_clients and self._aclient is not None:
            await self._aclient.close()

    @classmethod
    def class_name(cls) -> str:
        return "RagplaneEmbedding"

    def _sync(self) -> Client:
        if self._client is None:
            raise ValueError("this embedding was made with aclient= only: use the async methods")
        return self._client

    def _async(self) -> AsyncClient:
        if self._aclient is None:
            raise ValueError("this embedding was made with client= only: use blocking methods")
        return self._aclient

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._sync().embed(texts, use_case=self.use_case).vectors

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._get_text_embedding(query)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return (await self._async().embed(texts, use_case=self.use_case)).vectors

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self._aget_text_embeddings([text]))[0]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await self._aget_text_embedding(query)
