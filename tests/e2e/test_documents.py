"""Long documents over gRPC: chunking by default, the item as the unit the user sees, chunk
hits with exact offsets (non-ASCII text), replace and delete taking every chunk, top_k
counting items, search groups, the truncation count with chunking off, and the limits.

The server runs the fake embedder, whose tokens are whitespace words (+2 special tokens),
so chunk sizes are checked in those tokens."""

from __future__ import annotations

import grpc
import pytest

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.testkit.texts import corpus
from ragplane.v1 import common_pb2, index_pb2, search_pb2

pytestmark = pytest.mark.e2e

DENSE, LEXICAL, HYBRID = (
    common_pb2.SEARCH_MODE_DENSE,
    common_pb2.SEARCH_MODE_LEXICAL,
    common_pb2.SEARCH_MODE_HYBRID,
)
UNICODE = "naïve café — ünïcödé 日本語のテキスト 🐍 Ωmega straße"


def long_text(seed: int, words: int = 2400) -> str:
    """A real-prose document of about `words` words, with non-ASCII paragraphs between."""
    paras, n, i = [], 0, seed
    for t in corpus(400)[seed:]:
        paras.append(t)
        n += len(t.split())
        i += 1
        if i % 3 == 0:
            paras.append(f"{UNICODE} paragraph {i}.")
        if n >= words:
            break
    return "\n\n".join(paras)


def item(id, text, **meta):
    return common_pb2.Item(id=id, text=text, metadata=dict_to_struct(meta))


def search(server, text, mode=DENSE, top_k=10, coll="docs", **kw):
    req = search_pb2.SearchRequest(collection=coll, text=text, top_k=top_k, mode=mode, **kw)
    return server.stubs.search.Search(req)


def upsert(server, *items, coll="docs"):
    return server.stubs.index.Upsert(index_pb2.UpsertRequest(collection=coll, items=items))


def describe(server, coll="docs"):
    return server.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name=coll))


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


@pytest.fixture
def docs(server):
    server.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
    return server


def test_chunking_is_on_by_default_at_the_window(docs):
    info = describe(docs)
    assert info.chunking.enabled and info.chunking.max_tokens == 256
    assert info.chunking.overlap_tokens == 32 and info.chunking.min_tokens == 128
    assert info.chunking.splitter == index_pb2.CHUNK_SPLITTER_TEXT


def test_a_long_text_is_one_item_of_many_chunks_with_exact_offsets(docs):
    text = long_text(0)
    resp = upsert(docs, item("doc", text, src="a"), item("short", "a short note about tea"))
    assert resp.upserted == 2 and resp.chunks > 10 and resp.truncated == 0
    info = describe(docs)
    assert info.count == 2 and info.chunks == resp.chunks
    got = docs.stubs.index.Get(index_pb2.GetRequest(collection="docs", ids=["doc"]))
    assert got.items[0].text == text  # the whole text, not a chunk
    tail = " ".join(text.split()[-40:-25])  # from the end of the document
    for mode in (DENSE, LEXICAL, HYBRID):
        res = search(docs, tail, mode, top_k=2, include_text=True, chunks_per_hit=3)
        hit = res.hits[0]
        assert hit.id == "doc" and len({h.id for h in res.hits}) == len(res.hits)
        assert 1 <= len(hit.chunks) <= 3 and hit.text == text
        for c in hit.chunks:
            assert text[c.start : c.end] == c.text and c.text  # code-point offsets, exact
            assert len(c.text.split()) + 2 <= 256
        assert hit.chunks[0].score == pytest.approx(hit.score)
        assert any(tail in c.text for c in hit.chunks), mode


def test_offsets_are_exact_for_every_chunk_of_a_non_ascii_document(docs):
    text = long_text(3)
    upsert(docs, item("doc", text))
    res = search(docs, "ünïcödé", LEXICAL, top_k=1, include_text=True, chunks_per_hit=16)
    hits = res.hits[0].chunks
    assert len(hits) > 3 and all(text[c.start : c.end] == c.text for c in hits)
    assert all("ünïcödé" in c.text for c in hits)  # the passages that matched
    assert len({c.index for c in hits}) == len(hits)
    assert [c.score for c in hits] == sorted((c.score for c in hits), reverse=True)


def test_top_k_counts_items_never_chunks(docs):
    upsert(docs, *(item(f"d{i}", long_text(i * 40)) for i in range(3)))
    upsert(docs, *(item(f"s{i}", t) for i, t in enumerate(corpus(20))))
    for mode in (DENSE, LEXICAL, HYBRID):
        res = search(docs, corpus(400)[5], mode, top_k=8)
        ids = [h.id for h in res.hits]
        assert len(ids) == len(set(ids)) == 8 == res.returned_k, mode
    res = search(docs, corpus(400)[5], DENSE, top_k=23)
    assert res.returned_k == 23 and res.exhaustive  # every item, each once


def test_replacing_a_document_removes_every_old_chunk(docs):
    text = long_text(7) + "\n\nThe zanzibarquux protocol ends the document."
    first = upsert(docs, item("doc", text))
    assert search(docs, "zanzibarquux", LEXICAL).hits[0].id == "doc"
    upsert(docs, item("doc", "a new short version about otters"))
    assert search(docs, "zanzibarquux", LEXICAL).hits == []
    info = describe(docs)
    assert info.count == 1 and info.chunks == 1 and info.tombstones == first.chunks
    res = search(docs, "zanzibarquux protocol", DENSE, top_k=5, chunks_per_hit=16)
    assert [h.id for h in res.hits] == ["doc"] and [c.index for c in res.hits[0].chunks] == [0]
    docs.stubs.index.Delete(index_pb2.DeleteRequest(
        collection="docs", ids=common_pb2.IdList(ids=["doc"])))
    assert describe(docs).count == 0 and describe(docs).chunks == 0
    assert search(docs, "otters", LEXICAL).hits == []


def test_a_filter_delete_takes_all_chunks_and_counts_items(docs):
    upsert(docs, item("a", long_text(1), src="x"), item("b", long_text(9), src="y"))
    resp = docs.stubs.index.Delete(index_pb2.DeleteRequest(
        collection="docs", filter=common_pb2.Filter(must=[common_pb2.Condition(
            field="src", op=common_pb2.FILTER_OP_EQ, value=py_to_value("x"))])))
    assert resp.deleted == 1
    info = describe(docs)
    assert info.count == 1 and info.chunks > 1
    assert {h.id for h in search(docs, corpus(400)[1], LEXICAL, top_k=10).hits} == {"b"}


def test_search_groups_by_a_metadata_field(docs):
    items = [item(f"{src}{i}", t, src=src) for i, t in enumerate(corpus(30))
             for src in ("a", "b", "c") if i % 3 == "abc".index(src)]
    items.append(item("nosrc", corpus(30)[0]))
    upsert(docs, *items)
    res = search(docs, corpus(30)[0], DENSE, top_k=10, group_by="src", group_size=2,
                 group_limit=2, include_metadata=False)
    assert not res.hits and len(res.groups) == 2
    for g in res.groups:
        assert len(g.hits) == 2 and all(h.id.startswith(g.key.string_value) for h in g.hits)
        assert all(not h.metadata.fields for h in g.hits)
    assert res.groups[0].key.string_value == "a"  # corpus(30)[0] is a0
    assert code_of(lambda: search(docs, "x", DENSE, group_by="src", group_size=101))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT)
    for bad in ("a..b", 'a"b', " "):  # the rule of every metadata field name
        code, details = code_of(lambda b=bad: search(docs, "x", DENSE, group_by=b))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "group_by" in details


def _deep_group_items():
    """45 items holding 'zebra' (from 50 times down to 6 in 60 words, so the dense, lexical
    and hybrid rankings of 'zebra' all follow that order) in groups by rank: a at ranks 0,
    40 and 41, b at 1-3, then groups of three; 50 items without it, and so without a group."""
    ranks = {0: "a", 40: "a", 41: "a"}
    others = [i for i in range(45) if i not in ranks]
    for n, i in enumerate(others):
        ranks[i] = "b" if n < 3 else f"g{(n - 3) // 3}"
    items = [item(f"z{i:02d}", " ".join(["zebra"] * (50 - i) + ["pad"] * (10 + i)),
                  src=ranks[i]) for i in range(45)]
    return items + [item(f"p{i:02d}", " ".join(["pad"] * 60)) for i in range(50)]


def _cut_groups(hits, field, size, limit):
    """Groups cut from a ranking by hand: the first `limit` keys, each with its first
    `size` hits."""
    out: dict = {}
    for h in hits:
        key = h.metadata.fields[field].string_value if field in h.metadata.fields else None
        if key is None or (key not in out and len(out) == limit):
            continue
        members = out.setdefault(key, [])
        if len(members) < size:
            members.append(h.id)
    return list(out.items())


@pytest.mark.parametrize("mode", [DENSE, LEXICAL, HYBRID])
def test_groups_equal_those_cut_from_the_whole_ranking(docs, mode):
    upsert(docs, *_deep_group_items())
    whole = search(docs, "zebra", mode, top_k=200, include_metadata=True).hits
    assert len(whole) >= 45
    expected = _cut_groups(whole, "src", 3, 2)
    assert expected[0] == ("a", ["z00", "z40", "z41"])  # a's later hits rank past 2 x 3 x 2
    assert [h.id for h in whole].index("z40") > 2 * 3 * 2
    res = search(docs, "zebra", mode, top_k=10, group_by="src", group_size=3, group_limit=2)
    got = [(g.key.string_value, [h.id for h in g.hits]) for g in res.groups]
    assert got == expected and res.returned_k == 6
    # a group with fewer matching items than the size holds them all, the rest are full
    res = search(docs, "zebra", mode, top_k=10, group_by="src", group_size=4, group_limit=3)
    got = [(g.key.string_value, [h.id for h in g.hits]) for g in res.groups]
    assert got == _cut_groups(whole, "src", 4, 3)
    assert [len(m) for _, m in got] == [3, 3, 3]


def test_chunking_off_embeds_truncated_and_says_how_many(server):
    server.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(
        name="flat", chunking=index_pb2.Chunking(enabled=False)))
    text = long_text(2)
    resp = upsert(server, item("doc", text), item("s", "short"), coll="flat")
    assert resp.truncated == 1 and resp.chunks == 2
    info = describe(server, "flat")
    assert not info.chunking.enabled and info.count == info.chunks == 2
    hit = search(server, text.split("\n\n")[0], coll="flat").hits[0]
    assert hit.id == "doc" and not hit.chunks


def test_limits_and_bad_settings_are_invalid_argument(server):
    make = server.stubs.index.CreateCollection
    for bad in (index_pb2.Chunking(enabled=True, max_tokens=1000),
                index_pb2.Chunking(enabled=True, max_tokens=64, overlap_tokens=40)):
        code, details = code_of(lambda b=bad: make(
            index_pb2.CreateCollectionRequest(name="bad", chunking=b)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "chunking." in details
    make(index_pb2.CreateCollectionRequest(name="docs"))
    big = "word " * (4 * 1024 * 1024 // 5 + 1)
    code, details = code_of(lambda: upsert(server, item("big", big)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_item_text_bytes" in details
    resp = upsert(server, item("ok", long_text(0, words=20000)))  # over the old 64 KiB
    assert resp.chunks > 50
    code, details = code_of(lambda: search(server, "x", chunks_per_hit=17))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "chunks_per_hit" in details


def test_a_long_memory_is_chunked_and_recalled_by_its_last_words(server):
    from ragplane.v1 import memory_pb2

    mem = server.stubs.memory
    text = long_text(11, words=1500) + "\n\nThe user keeps a quokkaphrase at the very end."
    first = mem.Remember(memory_pb2.RememberRequest(namespace="agent", text=text))
    for t in corpus(60)[40:]:  # others that a truncated vector would rank above it
        mem.Remember(memory_pb2.RememberRequest(namespace="agent", text=t))
    for mode in (DENSE, LEXICAL, HYBRID):
        got = mem.Recall(memory_pb2.RecallRequest(
            namespace="agent", query="quokkaphrase at the very end", top_k=2, mode=mode))
        assert got.memories[0].id == first.id and got.memories[0].text == text, mode
        assert len({m.id for m in got.memories}) == len(got.memories)
    again = mem.Remember(memory_pb2.RememberRequest(namespace="agent", text=text))
    assert again.deduplicated and again.id == first.id  # by its first chunk's vector
    listed = mem.ListMemories(memory_pb2.ListMemoriesRequest(namespace="agent", page_size=50))
    assert sorted(m.id for m in listed.memories).count(first.id) == 1
    assert len(listed.memories) == 21
