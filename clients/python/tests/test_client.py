"""Every method of the sync Client against a real server: what it sends (the options of
each call reach the server) and what it returns (plain dataclasses, metadata as dicts)."""

from __future__ import annotations

import grpc
import pytest

from ragplane_client import Chunking, Client, IndexParams, Item, SearchParams
from ragplane_client import filters as f

DOCS = [
    {"id": "1", "text": "sqlite is the source of truth", "metadata": {"year": 2024, "lang": "en"}},
    {"id": "2", "text": "faiss indexes are derived and checkpointed", "metadata": {"year": 2019}},
    {"id": "3", "text": "call SSL_CTX_set_options before the handshake", "metadata": {"lang": "c"}},
]


@pytest.fixture
def docs(client):
    client.create_collection("docs")
    client.upsert("docs", DOCS)
    return client


def long_text(words: int = 700) -> str:
    vocab = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    sents = [
        " ".join(vocab[(i + j) % len(vocab)] for j in range(9)) + "." for i in range(words // 9)
    ]
    return (
        " ".join(sents[:40])
        + "\n\nthe quick brown fox jumps over the lazy dog.\n\n"
        + " ".join(sents[40:])
    )


def test_embed_and_embedder_info(client):
    e = client.embed(["hello world", "hello there"])
    assert e.dim == 64 and len(e.vectors) == 2 and len(e.vectors[0]) == 64
    assert e.embedder.startswith("fake@") and e.token_counts == [4, 4]
    raw = client.embed(["hello world"], normalize=False)
    assert sum(x * x for x in raw.vectors[0]) > 1.01  # the sum of two unnormalised word vectors
    info = client.embedder_info()
    assert info.dim == 64 and info.embedder == e.embedder and info.max_batch_texts > 0
    with pytest.raises(TypeError):
        client.embed("one string")


def test_collection_lifecycle_with_options(client):
    info = client.create_collection(
        "c1",
        metric="ip",
        index_type="hnsw",
        params=IndexParams(hnsw_m=16),
        lexical_index=False,
        chunking=Chunking(max_tokens=64, overlap_tokens=8, splitter="markdown"),
    )
    assert (info.name, info.metric, info.index_type, info.dim) == ("c1", "ip", "hnsw", 64)
    assert info.params.hnsw_m == 16 and not info.lexical_index
    assert info.chunking == Chunking(True, 64, 8, "markdown")
    off = client.create_collection("c2", chunking=False, params={"hnsw_m": 8})
    assert off.chunking.enabled is False and off.metric == "cosine" and off.index_type == "flat"
    assert {c.name for c in client.list_collections()} == {"c1", "c2"}
    assert client.describe_collection("c1") == info
    assert client.delete_collection("c1") is True
    with pytest.raises(grpc.RpcError) as e:
        client.describe_collection("c1")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ValueError, match="unknown metric"):
        client.create_collection("c3", metric="hamming")


def test_search_params_reach_the_server(client):
    info = client.create_collection("h", index_type="hnsw", params=IndexParams(quantization="int8"))
    assert info.params.quantization == "none"  # int8 is trained at a rebuild, over 1,000 items
    client.upsert("h", DOCS)
    exact = client.search("h", "source of truth", top_k=2, params=SearchParams(exact=True))
    assert exact.exhaustive and exact.hits[0].id == "1"
    tuned = client.search("h", "source of truth", top_k=2, params={"oversampling": 2})
    assert [h.id for h in tuned.hits] == [h.id for h in exact.hits]
    client.create_collection("flat")
    with pytest.raises(grpc.RpcError) as e:
        client.search("flat", "x", params=SearchParams(ef_search=64))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ef_search applies to hnsw collections" in (e.value.details() or "")


def test_create_collection_exist_ok_returns_the_one_there(client):
    made = client.create_collection("q", metric="ip", chunking=False)
    client.upsert("q", [{"id": "1", "text": "kept across runs"}])
    with pytest.raises(grpc.RpcError) as e:
        client.create_collection("q", metric="ip")
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    again = client.create_collection("q", exist_ok=True, metric="ip", chunking=False)
    assert (again.name, again.metric, again.count) == ("q", "ip", 1)
    assert again.created_at == made.created_at
    assert client.create_collection("q", exist_ok=True).count == 1  # defaults: not compared
    with pytest.raises(ValueError, match="exists with metric='ip', not 'cosine'"):
        client.create_collection("q", exist_ok=True, metric="cosine")
    with pytest.raises(ValueError, match="exists with chunking=False, not True"):
        client.create_collection("q", exist_ok=True, chunking=True)
    assert client.create_collection("fresh", exist_ok=True).name == "fresh"


def test_upsert_batches_by_count_and_bytes(client):
    client.create_collection("b")
    items = [Item(str(i), f"item number {i} " + "word " * 20) for i in range(10)]
    r = client.upsert("b", items, batch_size=3)
    assert (r.upserted, r.chunks, r.batches, r.truncated) == (10, 10, 4, 0)
    assert r.embedder.startswith("fake@")
    r = client.upsert("b", ({"id": str(i), "text": "x " * 200} for i in range(6)), batch_bytes=900)
    assert r.upserted == 6 and r.batches == 3  # ~420 bytes an item: two a batch
    assert client.describe_collection("b").count == 10
    with pytest.raises(ValueError, match="unknown item key"):
        client.upsert("b", [{"id": "x", "txt": "typo"}])


def test_get_with_vectors_and_metadata_as_plain_dicts(docs):
    docs.upsert(
        "docs", [Item("v", vector=[1.0] + [0.0] * 63, metadata={"n": [1, 2.5], "a": {"b": None}})]
    )
    got = docs.get("docs", ["1", "missing", "v"], include_vectors=True)
    assert [g.id for g in got] == ["1", "v"]
    assert got[0].metadata == {"year": 2024, "lang": "en"} and isinstance(
        got[0].metadata["year"], int
    )
    assert got[0].text == DOCS[0]["text"] and len(got[0].vector) == 64
    assert got[1].metadata == {"n": [1, 2.5], "a": {"b": None}} and got[1].vector[0] == 1.0
    assert docs.get("docs", ["1"])[0].vector is None


def test_delete_by_ids_and_by_filter(docs):
    assert docs.delete("docs", ["1", "nope"]) == 1
    assert docs.delete("docs", filter=f.where(f.lt("year", 2020))) == 1
    assert [g.id for g in docs.get("docs", ["1", "2", "3"])] == ["3"]
    with pytest.raises(ValueError, match="exactly one"):
        docs.delete("docs")


def test_search_in_every_mode_with_scores(docs):
    dense = docs.search("docs", "where is the source of truth", top_k=2)
    assert dense.hits[0].id == "1" and len(dense) == 2 and dense.exhaustive
    h = dense.hits[0]
    assert h.dense_score == pytest.approx(h.score) and h.lexical_score is None
    assert h.text == DOCS[0]["text"] and h.metadata == {"year": 2024, "lang": "en"}
    assert h.chunks[0].index == 0 and (h.chunks[0].start, h.chunks[0].end) == (0, len(h.text))
    lex = docs.search("docs", "SSL_CTX_set_options", mode="lexical", top_k=3)
    assert [x.id for x in lex] == ["3"] and lex.hits[0].lexical_score > 0
    assert lex.hits[0].dense_score is None and lex.hits[0].fused_score is None
    hyb = docs.search(
        "docs",
        "SSL_CTX_set_options handshake",
        mode="hybrid",
        fusion="rrf",
        rrf_k=10,
        dense_weight=0.3,
    )
    assert hyb.hits[0].id == "3"
    top = hyb.hits[0]
    assert None not in (top.dense_score, top.lexical_score, top.fused_score)
    bare = docs.search("docs", "truth", include_text=False, include_metadata=False)
    assert bare.hits[0].text == "" and bare.hits[0].metadata == {}
    vec = docs.embed([DOCS[1]["text"]]).vectors[0]
    assert docs.search("docs", vec, top_k=1).hits[0].id == "2"
    with pytest.raises(ValueError, match="unknown search mode"):
        docs.search("docs", "x", mode="semantic")


def test_search_filters_dicts_and_helpers(docs):
    q = "sqlite faiss ssl source truth"
    dict_filter = {"must": [{"field": "year", "op": "gte", "value": 2020}]}
    assert [h.id for h in docs.search("docs", q, filter=dict_filter)] == ["1"]
    assert {h.id for h in docs.search("docs", q, filter=f.where(f.exists("year")))} == {"1", "2"}
    either = f.where(should=[f.eq("lang", "c"), f.lt("year", 2020)])
    assert {h.id for h in docs.search("docs", q, filter=either)} == {"2", "3"}
    assert {
        h.id
        for h in docs.search(
            "docs", q, filter=f.where(f.in_("lang", ["en", "c"]), must_not=[f.eq("lang", "c")])
        )
    } == {"1"}
    assert {h.id for h in docs.search("docs", q, filter=f.where(f.ne("lang", "en")))} == {"2", "3"}
    with pytest.raises(ValueError, match="unknown filter op"):
        docs.search("docs", q, filter={"must": [{"field": "a", "op": "like", "value": 1}]})


def test_chunk_hits_and_groups(client):
    client.create_collection("long", chunking={"max_tokens": 64})
    text = long_text()
    r = client.upsert(
        "long",
        [
            Item("doc", text, metadata={"src": "a"}),
            Item("note", "a fox note", metadata={"src": "b"}),
            Item("other", "quick brown fox", metadata={"src": "b"}),
        ],
    )
    assert r.upserted == 3 and r.chunks > 5
    hits = client.search(
        "long", "the quick brown fox jumps over the lazy dog", top_k=3, chunks_per_hit=3
    )
    doc = next(h for h in hits if h.id == "doc")
    assert len(doc.chunks) == 3 and doc.chunks[0].score >= doc.chunks[1].score
    best = doc.chunks[0]
    assert (
        "quick brown fox" in text[best.start : best.end]
        and best.text == text[best.start : best.end]
    )
    g = client.search("long", "quick brown fox", top_k=5, group_by="src", group_size=2)
    assert g.hits == () and [grp.key for grp in g.groups][:2] in (["b", "a"], ["a", "b"])
    assert {h.id for grp in g.groups if grp.key == "b" for h in grp.hits} == {"note", "other"}


def test_memory_remember_recall_forget_list(client):
    ns = "agent-42"
    a = client.remember(ns, "the user prefers dark mode", metadata={"kind": "pref"}, importance=0.9)
    again = client.remember(ns, "the user prefers dark mode")
    assert again.deduplicated and again.id == a.id
    b = client.remember(ns, "the user lives in lisbon", ttl_seconds=3600)
    client.remember(ns, "the meeting is on tuesday", metadata={"kind": "event"})
    mems = client.recall(ns, "which mode does the user prefer", top_k=2)
    assert mems[0].id == a.id and mems[0].parts.relevance > 0 and mems[0].score > 0
    assert mems[0].metadata == {"kind": "pref"} and mems[0].importance == pytest.approx(0.9)
    lex = client.recall(ns, "lisbon", mode="lexical", top_k=1)
    assert lex[0].id == b.id and lex[0].parts.lexical > 0 and lex[0].expires_at > 0
    hyb = client.recall(ns, "dark mode", mode="hybrid", fusion="weighted", top_k=1)
    assert hyb[0].parts.fused is not None
    only = client.recall(ns, "the user", filter=f.where(f.eq("kind", "event")))
    assert [m.text for m in only] == ["the meeting is on tuesday"]
    page = client.list_memories(ns, page_size=2)
    assert len(page.memories) == 2 and page.next_page_token
    assert len(list(client.iter_memories(ns, page_size=2))) == 3
    assert client.forget(ns, [b.id]) == 1
    assert client.forget(ns, filter=f.where(f.eq("kind", "pref"))) == 1
    assert client.forget(ns, all=True) == 1
    with pytest.raises(grpc.RpcError) as e:  # the server's word for an empty namespace
        client.list_memories(ns)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ValueError, match="exactly one"):
        client.forget(ns)


def test_errors_are_grpc_status_and_stubs_reach_every_rpc(client):
    with pytest.raises(grpc.RpcError) as e:
        client.upsert("nope", [Item("1", "text")])
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details()
    from ragplane_client.v1 import admin_pb2

    status = client.stubs.admin.Status(admin_pb2.StatusRequest(), timeout=10)
    assert status.embedder.startswith("fake@")


def test_per_call_timeout_and_context_manager(target):
    with Client(target, timeout=None) as c:
        assert c.embed(["x"], timeout=5).dim == 64
    with pytest.raises(ValueError):
        c.embed(["closed"])
