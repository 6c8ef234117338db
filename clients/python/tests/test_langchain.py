"""ragplane_client.langchain against a real server: LangChain's own standard suites
(langchain-tests: the VectorStore suite, sync and async in one class, with its 6-dim fake
embeddings; the Embeddings suite over the Embed RPC), then what they do not cover:
filters, search modes, metadata types, MMR, retrievers, clients passed in.

langchain-core and langchain-tests come with the server's dev extra (`make install`); the
async tests run under pytest-asyncio's auto mode (clients/python/pyproject.toml)."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_tests.integration_tests import (
    EmbeddingsIntegrationTests,
    VectorStoreIntegrationTests,
)

from ragplane_client import AsyncClient, Client
from ragplane_client import filters as f
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


# --- ours: what the standard suites leave out -------------------------------------------


class Table(Embeddings):
    """Fixed vectors by text: rankings a test can reason about."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(self.table[t]) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return list(self.table[text])


class SpyClient(Client):
    """A Client that records the mode and query kind of each search."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.searches: list[tuple[str, str]] = []

    def search(self, collection, query, **options):  # type: ignore[override]
        kind = "text" if isinstance(query, str) else "vector"
        self.searches.append((options.get("mode", "dense"), kind))
        return super().search(collection, query, **options)


DOCS = [
    Document(id="1", page_content="sqlite is the source of truth",
             metadata={"year": 2024, "lang": "en", "tags": ["db"]}),
    Document(id="2", page_content="faiss indexes are derived and checkpointed",
             metadata={"year": 2019, "lang": "en"}),
    Document(id="3", page_content="die quelle der wahrheit ist sqlite",
             metadata={"year": 2021, "lang": "de"}),
    Document(id="4", page_content="call SSL_CTX_set_options before the handshake",
             metadata={"year": 2016, "lang": "c"}),
]  # fmt: skip


@pytest.fixture
def store(target):
    s = RagplaneVectorStore("docs", DeterministicFakeEmbedding(size=16), target=target)
    s.add_documents(DOCS)
    yield s
    s.close()


def ids(docs) -> list[str]:
    return [d.id for d in docs]


def test_dict_filters_equality_operators_lists_and_the_clients_form(store):
    found = store.similarity_search("sqlite", k=10, filter={"lang": "en"})
    assert sorted(ids(found)) == ["1", "2"]
    found = store.similarity_search("x", k=10, filter={"lang": "en", "year": {"$gte": 2020}})
    assert ids(found) == ["1"]
    found = store.similarity_search("x", k=10, filter={"lang": ["de", "c"]})
    assert sorted(ids(found)) == ["3", "4"]
    found = store.similarity_search("x", k=10, filter={"year": {"$gt": 2016, "$lt": 2024}})
    assert sorted(ids(found)) == ["2", "3"]
    found = store.similarity_search("x", k=10, filter={"tags": {"$exists": True}})
    assert ids(found) == ["1"]
    clients_form = f.where(f.gte("year", 2019), must_not=[f.eq("lang", "de")])
    assert sorted(ids(store.similarity_search("x", k=10, filter=clients_form))) == ["1", "2"]
    with pytest.raises(ValueError, match=r"unknown filter operator '\$near'"):
        store.similarity_search("x", filter={"year": {"$near": 1}})
    with pytest.raises(ValueError, match="dots"):
        store.similarity_search("x", filter={"author": {"name": "x"}})
    # delete takes the same filters
    assert store.delete(filter={"lang": "de"}) is True
    assert sorted(ids(store.get_by_ids(["1", "2", "3", "4"]))) == ["1", "2", "4"]


def test_lexical_mode_ranks_by_the_query_words_alone(target):
    spy = SpyClient(target)
    store = RagplaneVectorStore("docs", DeterministicFakeEmbedding(size=16), client=spy)
    store.add_documents(DOCS)
    hits = store.similarity_search_with_score("sqlite", k=10, mode="lexical")
    # only the documents holding the word, whatever their vectors
    assert sorted(ids(d for d, _ in hits)) == ["1", "3"]
    assert all(score > 0 for _, score in hits)
    assert spy.searches == [("lexical", "text")]
    lexical = RagplaneVectorStore("docs", DeterministicFakeEmbedding(size=16), client=spy,
                                  mode="lexical")  # fmt: skip
    assert ids(lexical.similarity_search("handshake", k=3)) == ["4"]
    spy.close()


def test_hybrid_with_another_embedding_fuses_dense_and_lexical_on_the_client(target):
    words = ["alpha beta", "gamma beta", "delta", "epsilon", "zeta", "eta"]
    spy = SpyClient(target)
    store = RagplaneVectorStore("h", DeterministicFakeEmbedding(size=16), client=spy)
    store.add_texts(words, ids=[str(i) for i in range(len(words))])
    hits = store.similarity_search_with_score("alpha beta", k=2, mode="hybrid")
    # "alpha beta": first in both rankings (same text, same vector); "gamma beta": second
    # lexically, so it outranks every document only the dense ranking has
    assert ids(d for d, _ in hits) == ["0", "1"]
    assert hits[0][1] == pytest.approx(2 / 61)
    assert 1 / 62 < hits[1][1] < 2 / 61
    assert spy.searches == [("dense", "vector"), ("lexical", "text")]
    with pytest.raises(ValueError, match="RRF only"):
        store.similarity_search("alpha", mode="hybrid", fusion="weighted")
    spy.close()


def test_hybrid_with_ragplane_embeddings_runs_on_the_server(target):
    spy = SpyClient(target)
    store = RagplaneVectorStore("h", RagplaneEmbeddings(target=target), client=spy, mode="hybrid")
    store.add_documents(DOCS)
    found = store.similarity_search("faiss indexes are derived and checkpointed", k=2)
    assert found[0].id == "2"
    assert spy.searches == [("hybrid", "text")]
    # dense searches still send the embedding's vector
    assert store.similarity_search("sqlite is the source of truth", k=1, mode="dense")[0].id == "1"
    assert spy.searches[-1] == ("dense", "vector")
    spy.close()


def same(a, b) -> None:
    """Equal, and of the same types all the way down (2.0 is not 2)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


METADATA = {
    "int": 3, "float": 2.5, "whole_float": 2.0, "negative": -7, "zero_float": 0.0,
    "bool": True, "false": False, "str": "x", "none": None,
    "list": [1, 2.0, "a", False, None, [3.0, 4]],
    "nested": {"deep": {"f": 1.0, "i": 1, "s": "y"}, "n": 7},
}  # fmt: skip


def test_metadata_round_trips_with_its_types(target):
    store = RagplaneVectorStore("types", DeterministicFakeEmbedding(size=8), target=target)
    store.add_texts(["typed"], [METADATA], ids=["t"])
    same(store.get_by_ids(["t"])[0].metadata, METADATA)
    same(store.similarity_search("typed", k=1)[0].metadata, METADATA)
    same(store.similarity_search("typed", k=1, mode="lexical")[0].metadata, METADATA)
    # the stored metadata is the plain values, so filters on numbers see them
    assert ids(store.similarity_search("typed", filter={"whole_float": 2})) == ["t"]
    assert ids(store.similarity_search("typed", filter={"nested.deep.f": {"$gte": 1}})) == ["t"]
    with pytest.raises(ValueError, match="reserved"):
        store.add_texts(["x"], [{"_ragplane_floats": []}])
    store.close()


NEAR = {
    "q": [1.0, 0.0, 0.0],
    "a1": [1.0, 0.0, 0.0],
    "a2": [0.99, 0.02, 0.0],
    "a3": [0.98, 0.03, 0.0],
    "b": [0.6, 0.0, 0.8],
}


def test_mmr_trades_relevance_for_diversity(target):
    store = RagplaneVectorStore("mmr", Table(NEAR), target=target)
    store.add_texts(["a1", "a2", "a3", "b"], ids=["a1", "a2", "a3", "b"])
    assert ids(store.similarity_search("q", k=2)) == ["a1", "a2"]
    assert ids(store.max_marginal_relevance_search("q", k=2, fetch_k=4, lambda_mult=0.3)) == [
        "a1",
        "b",
    ]
    # lambda_mult 1 is relevance alone
    assert ids(store.max_marginal_relevance_search("q", k=2, lambda_mult=1.0)) == ["a1", "a2"]
    by_vector = store.max_marginal_relevance_search_by_vector(
        NEAR["q"], k=2, fetch_k=4, lambda_mult=0.3
    )
    assert ids(by_vector) == ["a1", "b"]
    # candidates respect the filter
    store.add_texts(["b"], [{"skip": True}], ids=["b"])
    found = store.max_marginal_relevance_search(
        "q", k=2, lambda_mult=0.3, filter={"skip": {"$exists": False}}
    )
    assert ids(found) == ["a1", "a3"]
    store.close()


async def test_async_twins_mmr_retriever_and_delete_all(target):
    store = RagplaneVectorStore("amm", Table(NEAR), target=target)
    assert await store.aadd_texts(["a1", "a2", "a3", "b"], ids=["a1", "a2", "a3", "b"]) == [
        "a1", "a2", "a3", "b",
    ]  # fmt: skip
    assert ids(
        await store.amax_marginal_relevance_search("q", k=2, fetch_k=4, lambda_mult=0.3)
    ) == ["a1", "b"]
    hits = await store.asimilarity_search_by_vector_with_score(NEAR["q"], k=1)
    assert hits[0][0].id == "a1" and hits[0][1] == pytest.approx(1.0)
    retriever = store.as_retriever(
        search_type="mmr", search_kwargs={"k": 2, "fetch_k": 4, "lambda_mult": 0.3}
    )
    assert ids(await retriever.ainvoke("q")) == ["a1", "b"]
    assert await store.adelete() is True
    assert await store.asimilarity_search("q", k=4) == []
    await store.aadd_texts(["b"], ids=["b"])  # the collection is made again
    assert ids(await store.asimilarity_search("q", k=4)) == ["b"]
    await store.aclose()
    store.close()


def test_as_retriever_passes_k_filter_and_mode(store):
    retriever = store.as_retriever(search_kwargs={"k": 1, "filter": {"lang": "de"}})
    assert ids(retriever.invoke("anything")) == ["3"]
    lexical = store.as_retriever(search_kwargs={"k": 5, "mode": "lexical"})
    assert ids(lexical.invoke("faiss")) == ["2"]
    threshold = store.as_retriever(
        search_type="similarity_score_threshold",
        search_kwargs={"k": 4, "score_threshold": 0.999},
    )
    # the exact text has the same vector: cosine 1, relevance (1 + 1) / 2
    assert ids(threshold.invoke(DOCS[3].page_content)) == ["4"]


def test_delete_all_and_by_ids_and_unknown_keywords(store):
    assert store.delete(["2", "missing"]) is True
    assert sorted(ids(store.get_by_ids(["1", "2", "3", "4"]))) == ["1", "3", "4"]
    assert store.delete() is True
    assert store.get_by_ids(["1"]) == []
    assert store.similarity_search("sqlite") == []
    with pytest.raises(TypeError, match="unknown search keyword"):
        store.similarity_search("sqlite", top_k=3)
    with pytest.raises(ValueError, match="unknown search mode"):
        store.similarity_search("sqlite", mode="sparse")


def test_clients_passed_in_stay_open_and_from_texts(target):
    client = Client(target)
    store = RagplaneVectorStore.from_texts(
        ["one", "two"], DeterministicFakeEmbedding(size=4), [{"n": 1}, {"n": 2}],
        ids=["1", "2"], collection_name="ft", client=client,
    )  # fmt: skip
    store.close()
    assert client.describe_collection("ft").count == 2
    assert client.describe_collection("ft").dim == 4
    with pytest.raises(ValueError, match="async_client="):
        asyncio.run(store.asimilarity_search("one"))

    async def go():
        async with AsyncClient(target) as ac:
            s = await RagplaneVectorStore.afrom_texts(
                ["three"], DeterministicFakeEmbedding(size=4), ids=["3"],
                collection_name="ft", async_client=ac,
            )  # fmt: skip
            return ids(await s.asimilarity_search("three", k=1))

    assert asyncio.run(go()) == ["3"]
    assert client.describe_collection("ft").count == 3
    client.close()


def test_ragplane_embeddings_are_the_servers_vectors_in_batches(target, client):
    texts = [f"text number {i}" for i in range(5)]
    expected = client.embed(texts).vectors
    emb = RagplaneEmbeddings(target=target, batch_size=2)
    got = emb.embed_documents(texts)
    assert len(got) == 5 and len(got[0]) == 64
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e)
    assert emb.embed_query(texts[3]) == pytest.approx(expected[3])
    assert asyncio.run(emb.aembed_documents(texts))[4] == pytest.approx(expected[4])
    emb.close()
