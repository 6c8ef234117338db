"""ragplane_client.langchain against a real server: LangChain's own standard suites
(langchain-tests: the VectorStore suite, sync and async in one class, with its 6-dim fake
embeddings; the Embeddings suite over the Embed RPC), then what they do not cover:
filters, search modes, metadata types, MMR, retrievers, clients passed in.

langchain-core and langchain-tests come with the server's dev extra (`make install`); the
async tests run under pytest-asyncio's auto mode (clients/python/pyproject.toml)."""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import (
    EmbeddingsIntegrationTests,
    VectorStoreIntegrationTests,
)

from ragplane_client.langchain import RagplaneEmbeddings, RagplaneVectorStore


class TestRagplaneVectorStoreStandard(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, target):  # type: ignore[override]
        store = RagplaneVectorStore("standard", self.get_embeddings(), target=target)
        try:
            yield store
        finally:
            store.close()


class TestRagplaneEmbeddingsStandard(EmbeddingsIntegrationTests):
    @pytest.fixture
    def model(self, target):  # type: ignore[override]
        emb = RagplaneEmbeddings(target=target)
        try:
            yield emb
        finally:
            emb.close()

    @property
    def embeddings_class(self) -> type[RagplaneEmbeddings]:
        return RagplaneEmbeddings
