"""LangChain integration of ragplane: `pip install "ragplane-client[langchain]"`.

    from ragplane_client.langchain import RagplaneEmbeddings, RagplaneVectorStore

    emb = RagplaneEmbeddings(target="127.0.0.1:50051")
    store = RagplaneVectorStore("docs", emb, target="127.0.0.1:50051", mode="hybrid")
    store.add_texts(["sqlite is the source of truth"], [{"year": 2024}])
    store.as_retriever(search_kwargs={"k": 4, "filter": {"year": 2024}}).invoke("storage")

`RagplaneVectorStore` works with any LangChain embedding (it sends vectors);
`RagplaneEmbeddings` embeds with the server's embedder (the Embed RPC).
"""

try:
    import langchain_core  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        'ragplane_client.langchain needs langchain-core: pip install "ragplane-client[langchain]"'
    ) from e

from ragplane_client.langchain.embeddings import RagplaneEmbeddings
from ragplane_client.langchain.vectorstores import RagplaneVectorStore

__all__ = ["RagplaneEmbeddings", "RagplaneVectorStore"]
