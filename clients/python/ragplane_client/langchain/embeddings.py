"""`RagplaneEmbeddings`: LangChain's Embeddings over ragplane's Embed RPC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.embeddings import Embeddings

from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client
from ragplane_client.langchain._connect import Connection


class RagplaneEmbeddings(Embeddings):
    """Vectors from a ragplane server's embedder (`ragplane serve`).

        emb = RagplaneEmbeddings(target="127.0.0.1:50051")
        emb.embed_query("where is data kept?")  # list[float], the embedder's dim

    target: "host:port" (or a list of them), with **client_options passed to Client /
        AsyncClient (api_key, tls, root_certificates, timeout, retry, ...); or client=
        (for the sync methods) and async_client= (for the async ones).
    use_case: the case-of-use whose embedder answers ("" = the server's "embeddings").
        A RagplaneVectorStore runs hybrid searches on the server only when its embedding
        is a RagplaneEmbeddings of the default use case (the server embeds query text with
        that embedder); see RagplaneVectorStore.
    batch_size: texts per Embed call (the server refuses more than its max_batch_texts,
        2048 by default).
    normalize / truncate: as EmbedRequest (None = the server's default: both true).

    Errors are grpc.RpcError, as the client's.
    """

    def __init__(
        self,
        target: str | list[str] | None = None,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        use_case: str = "",
        batch_size: int = 256,
        normalize: bool | None = None,
        truncate: bool | None = None,
        **client_options: Any,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        self._conn = Connection(
            target, client=client, async_client=async_client, client_options=client_options
        )
        self.use_case = use_case
        self.batch_size = batch_size
        self._opts: Mapping[str, Any] = {
            "normalize": normalize, "truncate": truncate, "use_case": use_case,
        }  # fmt: skip

    @property
    def serves_default_use_case(self) -> bool:
        """Whether these vectors come from the embedder the server embeds query text with."""
        return self.use_case in ("", "embeddings")

    def _batches(self, texts: Sequence[str]) -> list[list[str]]:
        texts = list(texts)
        return [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for batch in self._batches(texts):
            out.extend(self._conn.sync.embed(batch, **self._opts).vectors)
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for batch in self._batches(texts):
            out.extend((await self._conn.aio.embed(batch, **self._opts)).vectors)
        return out

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]

    def close(self) -> None:
        """Close the blocking client made from `target` (see also `aclose`)."""
        self._conn.close()

    async def aclose(self) -> None:
        """Close the running event loop's AsyncClient made from `target`."""
        await self._conn.aclose()
