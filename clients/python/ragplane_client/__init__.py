"""ragplane-client: a typed Python client for ragplane, the retrieval data plane (text
embeddings, durable vector collections, dense / lexical / hybrid search with metadata
filters, and agent memory) over gRPC. It needs grpcio and protobuf only.

    from ragplane_client import Client, filters as f

    with Client("127.0.0.1:50051") as c:
        c.create_collection("docs")
        c.upsert("docs", [{"id": "1", "text": "SQLite is the source of truth",
                           "metadata": {"year": 2024}}])
        for hit in c.search("docs", "where is data kept?", top_k=5,
                            filter=f.where(f.gte("year", 2020))):
            print(hit.id, hit.score, hit.text)

`AsyncClient` has the same methods as coroutines (grpc.aio). The generated messages and
stubs are `ragplane_client.v1` (made from the server's protos by scripts/gen_protos.py).
"""

from ragplane_client import filters
from ragplane_client._transport import NO_RETRY, RetryPolicy, Stubs
from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client
from ragplane_client.types import (
    Chunk,
    Chunking,
    CollectionInfo,
    EmbedderInfo,
    Embeddings,
    Hit,
    HitGroup,
    IndexParams,
    Item,
    Memory,
    MemoryPage,
    Remembered,
    ScoreParts,
    SearchParams,
    SearchResult,
    UpsertResult,
)

__version__ = "0.1.0"

__all__ = [
    "NO_RETRY",
    "AsyncClient",
    "Chunk",
    "Chunking",
    "Client",
    "CollectionInfo",
    "EmbedderInfo",
    "Embeddings",
    "Hit",
    "HitGroup",
    "IndexParams",
    "Item",
    "Memory",
    "MemoryPage",
    "Remembered",
    "RetryPolicy",
    "ScoreParts",
    "SearchParams",
    "SearchResult",
    "Stubs",
    "UpsertResult",
    "filters",
]
