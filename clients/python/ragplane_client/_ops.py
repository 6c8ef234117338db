"""Each client method as an operation: which RPC, the request, and how its reply becomes
the method's result. Client and AsyncClient run the same operations, one with blocking
calls and one with grpc.aio, so the two cannot differ in what they send or return."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from ragplane_client import _replies as rep
from ragplane_client import _requests as req
from ragplane_client._transport import Rpc, rpc
from ragplane_client.types import (
    CollectionInfo,
    EmbedderInfo,
    Embeddings,
    Item,
    Memory,
    MemoryPage,
    Remembered,
    SearchResult,
    UpsertResult,
)
from ragplane_client.v1 import embed_pb2, index_pb2, memory_pb2

T = TypeVar("T")

EMBED, INFO = rpc("embed", "Embed"), rpc("embed", "Info")
CREATE, DROP = rpc("index", "CreateCollection"), rpc("index", "DeleteCollection")
LIST, DESCRIBE = rpc("index", "ListCollections"), rpc("index", "DescribeCollection")
UPSERT, GET, DELETE = rpc("index", "Upsert"), rpc("index", "Get"), rpc("index", "Delete")
SEARCH = rpc("search", "Search")
REMEMBER, RECALL = rpc("memory", "Remember"), rpc("memory", "Recall")
FORGET, MEMORIES = rpc("memory", "Forget"), rpc("memory", "ListMemories")


@dataclass(frozen=True)
class Op(Generic[T]):
    rpc: Rpc
    request: Any
    convert: Callable[[Any], T]
    timeout: float | None = None  # None = the client's


def _timeout(o: dict[str, Any]) -> float | None:
    return o.pop("timeout", None)


def reply_token(reply: Any) -> str:
    """A reply's consistency_token ("" when its message has none)."""
    return getattr(reply, "consistency_token", "") or ""


def newer(a: str, b: str) -> str:
    """The token of the later position of two (tokens are "<store>.<position>"); b when
    they are not comparable (another store, or not a token)."""
    pa, _, na = a.rpartition(".")
    pb, _, nb = b.rpartition(".")
    if pa == pb and na.isdigit() and nb.isdigit() and int(na) > int(nb):
        return a
    return b or a


def embed(
    texts: Sequence[str],
    normalize: bool | None,
    truncate: bool | None,
    use_case: str,
    timeout: float | None,
) -> Op[Embeddings]:
    return Op(EMBED, req.embed(texts, normalize, truncate, use_case), rep.embeddings, timeout)


def embedder_info(timeout: float | None) -> Op[EmbedderInfo]:
    return Op(INFO, embed_pb2.InfoRequest(), rep.embedder_info, timeout)


def create_collection(name: str, o: dict[str, Any]) -> Op[CollectionInfo]:
    t = _timeout(o)
    return Op(CREATE, req.create_collection(name, **o), rep.collection, t)


def already_exists(exc: Exception) -> bool:
    """Whether a CreateCollection failed because the name is taken."""
    return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.ALREADY_EXISTS


def same_settings(info: CollectionInfo, o: Mapping[str, Any]) -> CollectionInfo:
    """`info` (the collection that exists) when every option asked for agrees with it;
    ValueError naming the first that does not (exist_ok never hides another collection)."""
    chunking = o.get("chunking")
    asked = {
        "metric": o.get("metric"),
        "index_type": o.get("index_type"),
        "dim": o.get("dim") or None,  # 0 = the embedder's: any
        "lexical_index": o.get("lexical_index"),
    }
    held = {k: getattr(info, k) for k in asked}
    if isinstance(chunking, bool):
        asked["chunking"], held["chunking"] = chunking, info.chunking.enabled
    for k, v in asked.items():
        if v is not None and held[k] != v:
            raise ValueError(f"collection {info.name!r} exists with {k}={held[k]!r}, not "
                             f"{v!r}; use another name, or delete it first")
    return info


def list_collections(timeout: float | None, token: str = "") -> Op[list[CollectionInfo]]:
    return Op(
        LIST,
        index_pb2.ListCollectionsRequest(consistency_token=token),
        lambda r: [rep.collection(c) for c in r.collections],
        timeout,
    )


def describe_collection(name: str, timeout: float | None, token: str = "") -> Op[CollectionInfo]:
    r = index_pb2.DescribeCollectionRequest(name=name, consistency_token=token)
    return Op(DESCRIBE, r, rep.collection, timeout)


def delete_collection(name: str, timeout: float | None) -> Op[bool]:
    r = index_pb2.DeleteCollectionRequest(name=name)
    return Op(DROP, r, lambda x: bool(x.deleted), timeout)


def upserts(
    collection: str,
    items: Iterable[Item | Mapping[str, Any]],
    batch_size: int,
    batch_bytes: int,
    timeout: float | None,
) -> Iterator[Op[index_pb2.UpsertResponse]]:
    for r in req.upsert_batches(collection, items, batch_size, batch_bytes):
        yield Op(UPSERT, r, lambda x: x, timeout)


class UpsertTotals:
    """Adds up the replies of an upsert's batches."""

    def __init__(self) -> None:
        self.upserted = self.chunks = self.truncated = self.batches = 0
        self.embedder = self.token = ""

    def add(self, r: index_pb2.UpsertResponse) -> None:
        self.upserted += r.upserted
        self.chunks += r.chunks
        self.truncated += r.truncated
        self.batches += 1
        self.embedder = r.embedder or self.embedder
        self.token = newer(self.token, r.consistency_token)

    def result(self) -> UpsertResult:
        return UpsertResult(
            self.upserted, self.chunks, self.truncated, self.embedder, self.batches, self.token
        )


def get(
    collection: str,
    ids: Sequence[str],
    include_vectors: bool,
    timeout: float | None,
    token: str = "",
) -> Op[list[Item]]:
    r = req.get(collection, ids, include_vectors, token)
    return Op(GET, r, lambda x: [rep.item(it) for it in x.items], timeout)


def delete(collection: str, ids: Any, filter: Any, timeout: float | None) -> Op[int]:
    r = req.delete(collection, ids, filter)
    return Op(DELETE, r, lambda x: int(x.deleted), timeout)


def search(collection: str, query: Any, o: dict[str, Any]) -> Op[SearchResult]:
    t = _timeout(o)
    return Op(SEARCH, req.search(collection, query, **o), rep.search_result, t)


def remember(
    namespace: str,
    text: str,
    metadata: Mapping[str, Any] | None,
    importance: float | None,
    ttl_seconds: int,
    timeout: float | None,
) -> Op[Remembered]:
    r = req.remember(namespace, text, metadata, importance, ttl_seconds)
    return Op(REMEMBER, r, rep.remembered, timeout)


def recall(namespace: str, query: str, o: dict[str, Any]) -> Op[list[Memory]]:
    t = _timeout(o)
    return Op(RECALL, req.recall(namespace, query, **o), rep.memories, t)


def forget(namespace: str, ids: Any, filter: Any, all: bool, timeout: float | None) -> Op[int]:
    r = req.forget(namespace, ids, filter, all)
    return Op(FORGET, r, lambda x: int(x.forgotten), timeout)


def list_memories(
    namespace: str, page_size: int, page_token: str, timeout: float | None, token: str = ""
) -> Op[MemoryPage]:
    r = memory_pb2.ListMemoriesRequest(
        namespace=namespace, page_size=page_size, page_token=page_token, consistency_token=token
    )
    return Op(MEMORIES, r, rep.memory_page, timeout)
