"""RagplaneVectorStore against a real server: through LlamaIndex's VectorStoreIndex and
retrievers, and method by method (the cases LlamaIndex's Qdrant integration tests cover:
add / query, filters, delete by document, get_nodes / delete_nodes, clear, async twins,
hybrid). Filters' mapping alone: test_llama_index_filters.py."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import grpc
import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from ragplane_client import AsyncClient
from ragplane_client.llama_index import RagplaneEmbedding, RagplaneVectorStore

from llama_fakes import WordsEmbedding

EMB = WordsEmbedding()
TEXTS = {
    "a": ("sqlite is the source of truth for every collection", {"year": 2019, "lang": "en"}),
    "b": ("faiss indexes are derived and rebuilt from sqlite", {"year": 2021, "lang": "de"}),
    "c": ("hybrid search fuses dense and lexical rankings", {"year": 2023, "lang": "fr"}),
    "d": ("agent memory decays with recency and importance", {"lang": "en"}),
}


def _is_local(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # a unix socket path
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NetworkBlocked(ConnectionRefusedError):
    pass


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Python sockets may only connect to this machine (gRPC's own sockets are C-core's and
    go to the loopback test server): LlamaIndex must not fetch tokenizers or nltk data. An
    attempt is refused as a connection error (so callers clean up) and fails the test at
    teardown, even when the caller swallowed the error."""
    real, attempts = socket.socket.connect, []

    def connect(self: socket.socket, address: Any) -> Any:
        if not _is_local(address):
            attempts.append(address)
            raise NetworkBlocked(f"a test tried to reach the network: {address!r}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    assert not attempts, f"tests must stay offline; connections tried: {attempts}"


@pytest.fixture
def settings():
    """Settings.embed_model = WordsEmbedding, a MockLLM; restored afterwards."""
    saved = Settings._embed_model, Settings._llm
    Settings.embed_model = WordsEmbedding()
    Settings.llm = MockLLM()  # never the default (OpenAI, over the network)
    yield Settings
    Settings._embed_model, Settings._llm = saved


def node(key: str, doc: str = "doc-1", **extra) -> TextNode:
    text, meta = TEXTS[key]
    n = TextNode(id_=key, text=text, metadata={**meta, **extra})
    n.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=doc)
    n.embedding = EMB.vector(text)
    return n


@pytest.fixture
def store(client):
    s = RagplaneVectorStore("li", client=client)
    s.add([node("a"), node("b"), node("c", doc="doc-2"), node("d", doc="doc-2")])
    return s


def ids(nodes) -> set[str]:
    return {n.node_id for n in nodes}


def where(*filters, condition=FilterCondition.AND) -> MetadataFilters:
    return MetadataFilters(filters=list(filters), condition=condition)


def mf(key, op, value) -> MetadataFilter:
    return MetadataFilter(key=key, operator=op, value=value)


# --- through LlamaIndex ------------------------------------------------------------------


def test_index_insert_retrieve_and_delete_documents(client, settings):
    store = RagplaneVectorStore("docs", client=client)
    index = VectorStoreIndex.from_vector_store(store)
    index.insert(Document(text=TEXTS["a"][0], metadata={"year": 2019}, id_="doc-a"))
    index.insert(Document(text=TEXTS["c"][0], metadata={"year": 2023}, id_="doc-c"))
    info = client.describe_collection("docs")
    assert (info.count, info.dim, info.metric, info.chunking.enabled) == (2, 96, "cosine", False)

    hits = index.as_retriever(similarity_top_k=1).retrieve("where is the source of truth?")
    assert [h.node.ref_doc_id for h in hits] == ["doc-a"]
    assert hits[0].node.get_content() == TEXTS["a"][0]
    assert hits[0].node.metadata == {"year": 2019} and type(hits[0].node.metadata["year"]) is int
    assert 0 < hits[0].score <= 1.0

    only_2023 = where(mf("year", FilterOperator.GTE, 2020))
    hits = index.as_retriever(similarity_top_k=5, filters=only_2023).retrieve("source of truth")
    assert [h.node.ref_doc_id for h in hits] == ["doc-c"]

    index.delete_ref_doc("doc-a")
    hits = index.as_retriever(similarity_top_k=5).retrieve("where is the source of truth?")
    assert [h.node.ref_doc_id for h in hits] == ["doc-c"]
    assert client.describe_collection("docs").count == 1


def test_text_search_retriever_ranks_by_words(client, settings):
    store = RagplaneVectorStore("docs", client=client)
    index = VectorStoreIndex.from_vector_store(store)
    for key in "abc":
        index.insert(Document(text=TEXTS[key][0], id_=f"doc-{key}"))
    retriever = index.as_retriever(vector_store_query_mode="text_search", similarity_top_k=5)
    hits = retriever.retrieve("faiss rebuilt")
    assert [h.node.ref_doc_id for h in hits] == ["doc-b"]  # the only text with those words
    assert hits[0].score > 0  # BM25


# --- the store, method by method ---------------------------------------------------------


def test_add_and_query_round_trip_nodes(store, client):
    q = VectorStoreQuery(query_embedding=EMB.vector(TEXTS["b"][0]), similarity_top_k=2)
    res = store.query(q)
    assert res.ids[0] == "b" and res.similarities[0] == pytest.approx(1.0, abs=1e-5)
    assert res.similarities == sorted(res.similarities, reverse=True) and len(res.ids) == 2
    got = res.nodes[0]
    assert isinstance(got, TextNode) and got.node_id == "b" and got.text == TEXTS["b"][0]
    assert got.metadata == {"year": 2021, "lang": "de"} and type(got.metadata["year"]) is int
    assert got.ref_doc_id == "doc-1"
    # the item itself: text without metadata, filterable fields at the top level
    (item,) = client.get("li", ["b"])
    assert item.text == TEXTS["b"][0]
    assert item.metadata["year"] == 2021 and item.metadata["ref_doc_id"] == "doc-1"
    assert item.metadata["_node_id"] == "b"


def test_metadata_types_round_trip(client):
    n = TextNode(id_="t", text="typed metadata", metadata={
        "i": 3, "f": 2.0, "s": "x", "b": True, "n": None, "l": ["p", 1]})  # fmt: skip
    n.embedding = EMB.vector(n.text)
    n.excluded_embed_metadata_keys = ["s"]
    store = RagplaneVectorStore("typed", client=client)
    store.add([n])
    (back,) = store.get_nodes(["t"])
    assert back.metadata == n.metadata
    assert [type(back.metadata[k]) for k in "ifsb"] == [int, float, str, bool]
    assert back.excluded_embed_metadata_keys == ["s"]
    assert back.embedding == pytest.approx(n.embedding, abs=1e-6)


def test_add_refuses_nodes_without_embeddings(client):
    with pytest.raises(ValueError, match="no embedding"):
        RagplaneVectorStore("x", client=client).add([TextNode(id_="n", text="t")])


@pytest.mark.parametrize(
    ("op", "value", "expected"),
    [
        (FilterOperator.EQ, 2021, {"b"}),
        (FilterOperator.NE, 2021, {"a", "c", "d"}),  # d has no year: != holds
        (FilterOperator.GT, 2021, {"c"}),
        (FilterOperator.GTE, 2021, {"b", "c"}),
        (FilterOperator.LT, 2021, {"a"}),
        (FilterOperator.LTE, 2021, {"a", "b"}),
        (FilterOperator.IN, [2019, 2023], {"a", "c"}),
        (FilterOperator.NIN, [2019, 2023], {"b", "d"}),
    ],
)
def test_each_operator(store, op, value, expected):
    flt = where(mf("year", op, value))
    assert ids(store.get_nodes(filters=flt)) == expected
    q = VectorStoreQuery(query_embedding=EMB.vector("sqlite"), similarity_top_k=4, filters=flt)
    assert set(store.query(q).ids) == expected


def test_contains_and_any_on_array_fields(client):
    store = RagplaneVectorStore("tags", client=client)
    nodes = []
    for key, tags in (("a", ["db", "core"]), ("b", ["index"]), ("c", ["search", "db"])):
        nodes.append(node(key, tags=tags))
    store.add(nodes)
    assert ids(store.get_nodes(filters=where(mf("tags", FilterOperator.CONTAINS, "db")))) == {
        "a", "c"}  # fmt: skip
    got = store.get_nodes(filters=where(mf("tags", FilterOperator.ANY, ["index", "core"])))
    assert ids(got) == {"a", "b"}


def test_filters_compare_types_strictly(client):
    store = RagplaneVectorStore("types", client=client)
    store.add([node("a", some_key=1), node("b", some_key=2), node("c", some_key="3")])
    assert ids(store.get_nodes(filters=where(mf("some_key", FilterOperator.IN, [1, 2])))) == {
        "a", "b"}  # fmt: skip
    assert ids(store.get_nodes(filters=where(mf("some_key", FilterOperator.NIN, [1, 2])))) == {
        "c"}  # fmt: skip
    assert ids(store.get_nodes(filters=where(mf("some_key", FilterOperator.IN, ["3"])))) == {"c"}


def test_and_or_not_nesting(store):
    en_or_fr = where(mf("lang", "==", "en"), mf("lang", "==", "fr"), condition="or")
    assert ids(store.get_nodes(filters=en_or_fr)) == {"a", "c", "d"}
    recent_en_or_fr = where(mf("year", ">=", 2020), en_or_fr)
    assert ids(store.get_nodes(filters=recent_en_or_fr)) == {"c"}
    not_en = where(mf("lang", "==", "en"), condition="not")
    assert ids(store.get_nodes(filters=not_en)) == {"b", "c"}
    en_or_de = where(mf("lang", "==", "en"), mf("lang", "==", "de"), condition="or")
    assert ids(store.get_nodes(filters=where(en_or_de, condition="not"))) == {"c"}
    with pytest.raises(ValueError, match="nested AND group inside NOT"):
        store.get_nodes(filters=where(where(mf("year", ">", 0), en_or_de), condition="not"))
    assert ids(store.get_nodes(filters=where(mf("year", ">", 0), where(
        en_or_fr, condition="not")))) == {"b"}  # fmt: skip
    with pytest.raises(ValueError, match="one OR group per AND"):
        store.get_nodes(filters=where(en_or_fr, en_or_fr))


def test_delete_by_ref_doc_id(store):
    store.delete("doc-2")
    assert ids(store.get_nodes()) == {"a", "b"}
    store.delete("no-such-doc")
    assert ids(store.get_nodes()) == {"a", "b"}


def test_get_nodes_by_ids_and_filters(store):
    assert ids(store.get_nodes(["a", "c", "missing"])) == {"a", "c"}
    assert ids(store.get_nodes()) == {"a", "b", "c", "d"}
    assert all(n.embedding is not None and len(n.embedding) == 96 for n in store.get_nodes())
    assert ids(store.get_nodes(["a", "b", "c"], where(mf("lang", "==", "en")))) == {"a"}
    assert store.get_nodes([]) == []


def test_delete_nodes_by_ids_and_filters(store):
    store.delete_nodes(["a", "missing"])
    assert ids(store.get_nodes()) == {"b", "c", "d"}
    store.delete_nodes(["b", "d"], where(mf("lang", "==", "en")))  # only d is both
    assert ids(store.get_nodes()) == {"b", "c"}
    store.delete_nodes(filters=where(mf("year", "<", 2022)))
    assert ids(store.get_nodes()) == {"c"}
    with pytest.raises(ValueError, match="clear"):
        store.delete_nodes()
    store.delete_nodes([], where(mf("year", ">", 0)))  # no ids: nothing
    assert ids(store.get_nodes()) == {"c"}


def test_clear_then_add_again(store, client):
    store.clear()
    assert [c.name for c in client.list_collections()] == []
    assert store.get_nodes() == [] and store.get_nodes(["a"]) == []
    res = store.query(VectorStoreQuery(query_embedding=EMB.vector("sqlite"), similarity_top_k=3))
    assert res.ids == [] and res.nodes == []
    store.delete("doc-1")  # a missing collection deletes nothing, quietly
    store.add([node("a")])
    assert ids(store.get_nodes()) == {"a"}


def test_query_modes(store):
    q = VectorStoreQuery(query_str="lexical rankings", mode="text_search", similarity_top_k=4)
    res = store.query(q)
    assert res.ids == ["c"] and res.similarities[0] > 0
    both = VectorStoreQuery(query_str="sqlite", mode="text_search", similarity_top_k=4)
    assert set(store.query(both).ids) == {"a", "b"}
    both.sparse_top_k = 1
    assert len(store.query(both).ids) == 1
    sparse = VectorStoreQuery(query_str="sqlite", mode="sparse", similarity_top_k=4)
    assert set(store.query(sparse).ids) == {"a", "b"}
    scoped = VectorStoreQuery(query_embedding=EMB.vector("sqlite"), similarity_top_k=4,
                              doc_ids=["doc-2"], node_ids=["c", "a"])  # fmt: skip
    assert store.query(scoped).ids == ["c"]
    for mode in ("mmr", "svm", "semantic_hybrid"):
        with pytest.raises(ValueError, match=f"query mode '{mode}' is not supported"):
            store.query(VectorStoreQuery(query_embedding=EMB.vector("x"), mode=mode))
    with pytest.raises(ValueError, match="needs query_str"):
        store.query(VectorStoreQuery(query_embedding=EMB.vector("x"), mode="text_search"))


def test_existing_collection_and_foreign_items(client):
    client.create_collection("made", dim=96, index_type="hnsw")
    client.upsert("made", [{"id": "x", "text": "written without llamaindex",
                            "vector": EMB.vector("written"), "metadata": {"k": 1}}])  # fmt: skip
    store = RagplaneVectorStore("made", client=client)
    store.add([node("a")])
    assert client.describe_collection("made").index_type == "hnsw"
    (x,) = store.get_nodes(["x"])
    assert isinstance(x, TextNode) and x.text == "written without llamaindex"
    assert x.metadata == {"k": 1}
    assert ids(store.get_nodes()) == {"a", "x"}


def test_constructor(target):
    with pytest.raises(ValueError, match="target"):
        RagplaneVectorStore("x")
    store = RagplaneVectorStore("own", target=target)
    try:
        store.add([node("a")])
        assert ids(store.get_nodes()) == {"a"} and store.client is not None
    finally:
        asyncio.run(store.aclose())
    with pytest.raises(ValueError, match="rrf"):
        RagplaneVectorStore("x", target=target, hybrid_fusion="max")


# --- hybrid ------------------------------------------------------------------------------

HYBRID_DOCS = {
    "h1": "ranking ranking ranking ranking with vectors and words",
    "h2": "fusion of dense vectors with lexical words for ranking",
    "h3": "a rare zebra word appears here once among many other words",
    "h4": "unrelated text about gardening and soil",
}


def order(store, query: str, mode: str, **kw) -> list[str]:
    return store.query(VectorStoreQuery(query_str=query, mode=mode, **kw)).ids


def test_hybrid_alpha_is_the_dense_weight(client):
    emb = RagplaneEmbedding(client=client)
    store = RagplaneVectorStore("hy", client=client)
    nodes = [TextNode(id_=k, text=t, embedding=emb.get_text_embedding(t))
             for k, t in HYBRID_DOCS.items()]  # fmt: skip
    store.add(nodes)
    query = "zebra ranking words"
    dense = store.query(VectorStoreQuery(
        query_embedding=emb.get_query_embedding(query), similarity_top_k=4)).ids  # fmt: skip
    lexical = order(store, query, "text_search", similarity_top_k=4)
    assert dense[:2] != lexical[:2], "the two rankings must differ for this test to mean much"
    k = len(lexical)
    assert order(store, query, "hybrid", alpha=1.0, similarity_top_k=4)[:k] == dense[:k]
    assert order(store, query, "hybrid", alpha=0.0, similarity_top_k=4)[:k] == lexical
    assert len(order(store, query, "hybrid", similarity_top_k=4, hybrid_top_k=2)) == 2
    rrf = RagplaneVectorStore("hy", client=client, hybrid_fusion="rrf")
    res = rrf.query(VectorStoreQuery(query_str=query, mode="hybrid", similarity_top_k=4))
    assert res.similarities[0] < 0.1  # a reciprocal rank, not a min-max fused score


def test_hybrid_refused_over_callers_vectors(store):
    with pytest.raises(ValueError, match="RagplaneEmbedding"):
        store.query(VectorStoreQuery(query_str="sqlite", mode="hybrid", similarity_top_k=2))


# --- async twins ---------------------------------------------------------------------------


def test_async_twins(target):
    async def go():
        async with AsyncClient(target) as ac:
            store = RagplaneVectorStore("aio", aclient=ac)
            assert await store.async_add([node("a"), node("b"), node("c", doc="doc-2")]) == [
                "a", "b", "c"]  # fmt: skip
            q = VectorStoreQuery(query_embedding=EMB.vector(TEXTS["c"][0]), similarity_top_k=1)
            assert (await store.aquery(q)).ids == ["c"]
            got = await store.aget_nodes(filters=where(mf("year", ">", 2020)))
            assert ids(got) == {"b", "c"}
            assert ids(await store.aget_nodes(["a", "zz"])) == {"a"}
            await store.adelete_nodes(["a"])
            await store.adelete("doc-2")
            assert ids(await store.aget_nodes()) == {"b"}
            await store.adelete_nodes(filters=where(mf("lang", "==", "de")))
            assert await store.aget_nodes() == []
            await store.aclear()
            assert await ac.list_collections() == []
            with pytest.raises(ValueError, match="async"):
                store.get_nodes()

    asyncio.run(go())


def test_async_retriever_through_the_index(target, settings):
    async def go():
        async with AsyncClient(target) as ac:
            store = RagplaneVectorStore("aidx", aclient=ac)
            index = VectorStoreIndex.from_vector_store(store, use_async=True)
            await index.ainsert(Document(text=TEXTS["a"][0], id_="doc-a"))
            await index.ainsert(Document(text=TEXTS["d"][0], id_="doc-d"))
            hits = await index.as_retriever(similarity_top_k=1).aretrieve("memory recency")
            assert [h.node.ref_doc_id for h in hits] == ["doc-d"]
            await index.adelete_ref_doc("doc-d")
            hits = await index.as_retriever(similarity_top_k=2).aretrieve("memory recency")
            assert [h.node.ref_doc_id for h in hits] == ["doc-a"]

    asyncio.run(go())


def test_missing_collection_errors_other_than_not_found_propagate(client):
    client.create_collection("small", dim=8)
    store = RagplaneVectorStore("small", client=client)
    with pytest.raises(grpc.RpcError) as err:
        store.add([node("a")])  # 96-dim vectors into an 8-dim collection
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_network_guard_is_on(offline):
    with pytest.raises(NetworkBlocked):
        socket.create_connection(("203.0.113.7", 443), timeout=1)
    assert offline == [("203.0.113.7", 443)]
    offline.clear()  # seen: let the teardown pass


def test_ragplane_embedding_is_the_servers(target, client):
    emb = RagplaneEmbedding(target=target, embed_batch_size=2)
    texts = ["sqlite holds the truth", "faiss is derived", "memory decays"]

    async def go():
        try:
            assert emb.get_text_embedding_batch(texts) == client.embed(texts).vectors
            assert emb.get_query_embedding("faiss") == client.embed(["faiss"]).vectors[0]
            assert await emb.aget_query_embedding("faiss") == client.embed(["faiss"]).vectors[0]
            assert len(await emb.aget_text_embedding_batch(texts)) == 3
        finally:
            await emb.aclose()

    asyncio.run(go())
    with pytest.raises(ValueError, match="target"):
        RagplaneEmbedding()
