"""What each RagplaneVectorStore method does, written once for its sync and async twins.

Each operation is a generator that yields the calls it needs (`Embed`: the LangChain
embedding; `Call`: a method of the ragplane client) and is sent their results, or thrown
their grpc.RpcError; `run` drives one with Client and blocking embeddings, `arun` with
AsyncClient and the embedding's async methods. So the two cannot differ in what they
send, which errors they absorb, or what they return (as ragplane_client._ops does for
Client and AsyncClient)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client
from ragplane_client.langchain import _convert as cv
from ragplane_client.types import Hit

T = TypeVar("T")
MODES = ("dense", "lexical", "hybrid")
# Search keywords passed on to Client.search; any other is refused (a typo would else be
# ignored). fetch_k is the candidates per ranking of a client-side hybrid search.
SEARCH_OPTIONS = {"fusion", "rrf_k", "dense_weight", "timeout"}


@dataclass(frozen=True)
class Embed:
    texts: list[str]
    query: bool = False  # embed_query (one text) rather than embed_documents


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


Steps = Generator[Embed | Call, Any, T]


@dataclass(frozen=True)
class Spec:
    """The store's side of every operation: its collection, how a first write creates it,
    its default search mode, and whether the server can embed its query text (hybrid)."""

    collection: str
    create: Mapping[str, Any]
    mode: str
    server_embeds_queries: bool


def _code(e: grpc.RpcError) -> Any:
    return e.code() if hasattr(e, "code") else None


def run(steps: Steps[T], client: Client, embedding: Embeddings) -> T:
    result: Any = None
    error: grpc.RpcError | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value
        result, error = None, None
        try:
            if isinstance(step, Embed):
                result = (
                    embedding.embed_query(step.texts[0])
                    if step.query
                    else embedding.embed_documents(step.texts)
                )
            else:
                result = getattr(client, step.method)(*step.args, **step.kwargs)
        except grpc.RpcError as e:
            error = e


async def arun(steps: Steps[T], client: Callable[[], AsyncClient], embedding: Embeddings) -> T:
    result: Any = None
    error: grpc.RpcError | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value
        result, error = None, None
        try:
            if isinstance(step, Embed):
                pending: Awaitable[Any] = (
                    embedding.aembed_query(step.texts[0])
                    if step.query
                    else embedding.aembed_documents(step.texts)
                )
            else:
                pending = getattr(client(), step.method)(*step.args, **step.kwargs)
            result = await pending
        except grpc.RpcError as e:
            error = e


# --- writes --------------------------------------------------------------------------------


def add(
    spec: Spec,
    texts: Sequence[str],
    metadatas: Sequence[Mapping[str, Any] | None] | None,
    ids: Sequence[str | None] | None,
) -> Steps[list[str]]:
    """Embed the texts (embed_documents) and upsert them with their vectors; the first
    write creates the collection with the vectors' dimension."""
    texts = list(texts)
    ids = cv.new_ids(ids, len(texts))
    if not texts:
        return ids
    vectors = yield Embed(texts)
    batch = cv.items(ids, texts, vectors, metadatas)
    upsert = Call("upsert", (spec.collection, batch))
    try:
        yield upsert
    except grpc.RpcError as e:
        if _code(e) != grpc.StatusCode.NOT_FOUND:
            raise
        try:
            yield Call(
                "create_collection", (spec.collection,), {**spec.create, "dim": len(vectors[0])}
            )
        except grpc.RpcError as e2:  # another writer created it first
            if _code(e2) != grpc.StatusCode.ALREADY_EXISTS:
                raise
        yield upsert
    return ids


def delete(spec: Spec, ids: Sequence[str] | None, filter: Any) -> Steps[bool]:
    """By ids, by filter, or (neither) everything: the collection is dropped, as the
    server has no delete-all of items, and made again by the next write. Ids or a
    collection that do not exist are not an error (LangChain's contract)."""
    if ids is not None and filter is not None:
        raise ValueError("delete takes ids or filter=, not both")
    try:
        if ids is None and filter is None:
            yield Call("delete_collection", (spec.collection,))
        elif ids is None or len(ids):
            yield Call("delete", (spec.collection, ids), {"filter": cv.to_filter(filter)})
    except grpc.RpcError as e:
        if _code(e) != grpc.StatusCode.NOT_FOUND:
            raise
    return True


# --- reads ---------------------------------------------------------------------------------


def get_by_ids(spec: Spec, ids: Sequence[str]) -> Steps[list[Document]]:
    if not ids:
        return []
    try:
        got = yield Call("get", (spec.collection, [str(i) for i in ids]))
    except grpc.RpcError as e:
        if _code(e) != grpc.StatusCode.NOT_FOUND:
            raise
        return []
    return [cv.document(it.id, it.text, it.metadata) for it in got]


def _hits(spec: Spec, query: Any, options: dict[str, Any]) -> Steps[list[tuple[Hit, float]]]:
    """One Search; a collection not made yet (nothing written) has no hits."""
    try:
        result = yield Call("search", (spec.collection, query), options)
    except grpc.RpcError as e:
        if _code(e) != grpc.StatusCode.NOT_FOUND:
            raise
        return []
    return [(h, float(h.score)) for h in result]


def _options(k: int, filter: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(kwargs) - SEARCH_OPTIONS
    if unknown:
        raise TypeError(
            f"unknown search keyword(s) {sorted(unknown)}; the store takes filter, mode, "
            f"fetch_k and {', '.join(sorted(SEARCH_OPTIONS))}"
        )
    return {"top_k": int(k), "filter": cv.to_filter(filter), **kwargs}


def search(
    spec: Spec, query: str, k: int, filter: Any, kwargs: dict[str, Any]
) -> Steps[list[tuple[Document, float]]]:
    """The k best documents for the query text in `mode` (kwargs, else the store's).

    dense: the query embedded by the store's embedding (embed_query), searched by vector.
    lexical: the text alone (BM25 on the server).
    hybrid: on the server (its fusion; fusion, rrf_k, dense_weight apply) when it embeds
    query text with the embedder of the store's vectors; else on the client: a dense and
    a lexical search of `fetch_k` (default max(20, k)) candidates each, fused by RRF
    (rrf_k, default 60), as the server cannot be sent both a vector and a text."""
    kwargs = dict(kwargs)
    mode = kwargs.pop("mode", None) or spec.mode
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}; use one of {MODES}")
    fetch_k = int(kwargs.pop("fetch_k", 0)) or max(20, k)
    opts = _options(k, filter, kwargs)
    if mode == "lexical" or (mode == "hybrid" and spec.server_embeds_queries):
        hits = yield from _hits(spec, query, {**opts, "mode": mode})
    else:
        vector = yield Embed([query], query=True)
        if mode == "dense":
            hits = yield from _hits(spec, vector, opts)
        else:
            hits = yield from _client_hybrid(spec, query, vector, fetch_k, opts)
    return [(cv.document(h.id, h.text, h.metadata), s) for h, s in hits]


def _client_hybrid(
    spec: Spec, query: str, vector: list[float], fetch_k: int, opts: dict[str, Any]
) -> Steps[list[tuple[Hit, float]]]:
    if opts.pop("fusion", "rrf") != "rrf" or "dense_weight" in opts:
        raise ValueError(
            "this store's hybrid search fuses on the client, by RRF only (its embedding is "
            "not the server's, so the server cannot embed the query); drop fusion= and "
            "dense_weight=, or use RagplaneEmbeddings"
        )
    rrf_k = int(opts.pop("rrf_k", 60))
    k, opts["top_k"] = opts["top_k"], max(fetch_k, opts["top_k"])
    dense = yield from _hits(spec, vector, opts)
    lexical = yield from _hits(spec, query, {**opts, "mode": "lexical"})
    return cv.rrf([[h for h, _ in dense], [h for h, _ in lexical]], k, rrf_k)


def search_by_vector(
    spec: Spec, vector: Sequence[float], k: int, filter: Any, kwargs: dict[str, Any]
) -> Steps[list[tuple[Document, float]]]:
    """Dense search by a vector (a vector has no words for the other modes)."""
    kwargs = dict(kwargs)
    if kwargs.pop("mode", "dense") != "dense":
        raise ValueError("a search by vector is dense; search by text for lexical / hybrid")
    hits = yield from _hits(spec, list(vector), _options(k, filter, kwargs))
    return [(cv.document(h.id, h.text, h.metadata), s) for h, s in hits]


def mmr(
    spec: Spec,
    query: str | Sequence[float],
    k: int,
    fetch_k: int,
    lambda_mult: float,
    filter: Any,
    kwargs: dict[str, Any],
) -> Steps[list[Document]]:
    """Maximal marginal relevance: the fetch_k nearest items (dense search), their stored
    vectors read back with Get(include_vectors), then k of them picked by LangChain's
    maximal_marginal_relevance (lambda_mult 1 = relevance only, 0 = diversity only)."""
    kwargs = dict(kwargs)
    if kwargs.pop("mode", "dense") != "dense":
        raise ValueError("MMR ranks by vectors: its candidates come from a dense search")
    vector = (yield Embed([query], query=True)) if isinstance(query, str) else list(query)
    hits = yield from _hits(spec, vector, _options(max(fetch_k, k), filter, kwargs))
    if not hits:
        return []
    got = yield Call("get", (spec.collection, [h.id for h, _ in hits]), {"include_vectors": True})
    vectors = {it.id: it.vector for it in got if it.vector}
    hits = [(h, s) for h, s in hits if h.id in vectors]  # deleted between the two calls
    picked = maximal_marginal_relevance(
        np.asarray(vector, dtype=np.float32),
        [list(vectors[h.id]) for h, _ in hits],
        lambda_mult=lambda_mult,
        k=k,
    )
    return [cv.document(hits[i][0].id, hits[i][0].text, hits[i][0].metadata) for i in picked]
