"""LlamaIndex integration: `pip install "ragplane-client[llama-index]"`.

    from llama_index.core import Settings, VectorStoreIndex
    from ragplane_client.llama_index import RagplaneEmbedding, RagplaneVectorStore

    Settings.embed_model = RagplaneEmbedding(target="127.0.0.1:50051")
    store = RagplaneVectorStore("docs", target="127.0.0.1:50051")
    index = VectorStoreIndex.from_vector_store(store)

`RagplaneVectorStore` keeps LlamaIndex nodes in a ragplane collection and serves dense,
text (BM25) and hybrid queries with metadata filters; `RagplaneEmbedding` embeds with the
server's embedder; `to_filter` is how MetadataFilters become ragplane filters.
"""

from ragplane_client.llama_index.embedding import RagplaneEmbedding
from ragplane_client.llama_index.filters import to_filter
from ragplane_client.llama_index.vector_store import RagplaneVectorStore

__all__ = ["RagplaneEmbedding", "RagplaneVectorStore", "to_filter"]
