"""AsyncClient: the twin of every sync method against a real server, over grpc.aio.
Each test runs its own event loop (asyncio.run); the client opens its channels there."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ragplane_client import AsyncClient, Item
from ragplane_client import filters as f

DOCS = [
    Item("1", "sqlite is the source of truth", metadata={"year": 2024}),
    Item("2", "faiss indexes are derived and checkpointed", metadata={"year": 2019}),
    Item("3", "call SSL_CTX_set_options before the handshake", metadata={"lang": "c"}),
]


def run(coro_fn, *args):
    return asyncio.run(coro_fn(*args))


def test_async_embed_and_collections(target):
    async def go():
        async with AsyncClient(target) as c:
            e = await c.embed(["hello world"])
            assert e.dim == 64 and len(e.vectors[0]) == 64
            assert (await c.embedder_info()).embedder == e.embedder
            info = await c.create_collection("a", lexical_index=True, chunking={"max_tokens": 32})
            assert info.chunking.max_tokens == 32 and info.lexical_index
            assert [x.name for x in await c.list_collections()] == ["a"]
            again = await c.create_collection("a", exist_ok=True, lexical_index=True)
            assert again.created_at == info.created_at
            with pytest.raises(ValueError, match="lexical_index"):
                await c.create_collection("a", exist_ok=True, lexical_index=False)
            assert (await c.describe_collection("a")).count == 0
            assert await c.delete_collection("a") is True
            with pytest.raises(grpc.RpcError) as err:
                await c.describe_collection("a")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

    run(go)


def test_async_items_and_search(target):
    async def go():
        async with AsyncClient([target]) as c:
            await c.create_collection("docs")
            r = await c.upsert("docs", DOCS, batch_size=2)
            assert (r.upserted, r.batches) == (3, 2)
            got = await c.get("docs", ["2", "1"], include_vectors=True)
            assert [g.id for g in got] == ["2", "1"] and got[1].metadata == {"year": 2024}
            assert len(got[0].vector) == 64
            dense = await c.search("docs", "the source of truth", top_k=1)
            assert dense.hits[0].id == "1" and dense.hits[0].dense_score is not None
            lex = await c.search("docs", "SSL_CTX_set_options", mode="lexical")
            assert [h.id for h in lex] == ["3"]
            hyb = await c.search("docs", "handshake options", mode="hybrid", chunks_per_hit=2)
            assert hyb.hits[0].fused_score is not None and hyb.hits[0].chunks
            flt = await c.search("docs", "truth", filter=f.where(f.gte("year", 2020)))
            assert [h.id for h in flt] == ["1"]
            grouped = await c.search("docs", "truth", group_by="year")
            assert {g.key for g in grouped.groups} == {2024, 2019}
            assert (
                await c.delete(
                    "docs", filter={"must": [{"field": "lang", "op": "eq", "value": "c"}]}
                )
                == 1
            )
            assert await c.delete("docs", ["1"]) == 1
            assert [g.id for g in await c.get("docs", ["1", "2", "3"])] == ["2"]

    run(go)


def test_async_memory(target):
    async def go():
        c = AsyncClient(target)
        try:
            a = await c.remember("ns", "the user prefers dark mode", importance=0.8)
            assert (await c.remember("ns", "the user prefers dark mode")).deduplicated
            await c.remember("ns", "lunch is at noon", metadata={"kind": "event"})
            mems = await c.recall("ns", "dark mode preference", top_k=1)
            assert mems[0].id == a.id and mems[0].parts is not None
            lex = await c.recall("ns", "lunch", mode="lexical", filter=f.where(f.exists("kind")))
            assert [m.text for m in lex] == ["lunch is at noon"]
            page = await c.list_memories("ns", page_size=1)
            assert len(page.memories) == 1 and page.next_page_token
            assert len([m async for m in c.iter_memories("ns", page_size=1)]) == 2
            assert await c.forget("ns", [a.id]) == 1
            assert await c.forget("ns", all=True) == 1
        finally:
            await c.close()

    run(go)


def test_async_client_made_outside_the_loop_and_used_in_two_runs(target):
    c = AsyncClient(target)
    assert run(c.embed, ["x"]).dim == 64
    run(c.close)
    assert run(c.embed, ["y"]).dim == 64  # closed channels are reopened in the new loop
    run(c.close)
