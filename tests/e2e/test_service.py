"""End to end over gRPC: Embed, collections, upsert (text and vectors), search with and
without filters, delete, restart, search again — against a real server on port 0."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.v1 import common_pb2, embed_pb2, index_pb2, search_pb2

pytestmark = pytest.mark.e2e

EQ, GT, IN, EXISTS = (
    common_pb2.FILTER_OP_EQ,
    common_pb2.FILTER_OP_GT,
    common_pb2.FILTER_OP_IN,
    common_pb2.FILTER_OP_EXISTS,
)


def cond(field, op, value=None):
    c = common_pb2.Condition(field=field, op=op)
    if value is not None:
        c.value.CopyFrom(py_to_value(value))
    return c


def item(id, text="", vector=None, **meta):
    return common_pb2.Item(id=id, text=text, vector=vector or [], metadata=dict_to_struct(meta))


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_embed_returns_vectors_identity_and_token_counts(server):
    r = server.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["hello world", "hello"]))
    assert r.dim == 64 and len(r.vectors) == 2 and r.embedder == "fake@1"
    assert list(r.token_counts) == [4, 3]
    v = np.array([x.values for x in r.vectors])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    raw = server.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["hello world"], normalize=False))
    assert not np.isclose(np.linalg.norm(raw.vectors[0].values), 1.0)


def test_embed_stream_answers_each_chunk_in_order(server):
    chunks = [embed_pb2.EmbedRequest(texts=[f"text {i} {j}" for j in range(3)]) for i in range(4)]
    replies = list(server.stubs.embed.EmbedStream(iter(chunks)))
    assert [len(r.vectors) for r in replies] == [3, 3, 3, 3]
    single = server.stubs.embed.Embed(chunks[2])
    assert replies[2].vectors[1].values == single.vectors[1].values


def test_collection_lifecycle_with_restart(server):
    s = server.stubs
    info = s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
    assert info.dim == 64 and info.embedder == "fake@1" and info.metric == index_pb2.METRIC_COSINE
    texts = {
        "a": ("the cat sat on the mat", {"kind": "animal", "year": 2020}),
        "b": ("dogs chase cats in the park", {"kind": "animal", "year": 2022}),
        "c": ("python list and dictionaries", {"kind": "code", "year": 2021}),
        "d": ("sorting a list in python", {"kind": "code", "year": 2024, "tags": "x"}),
    }
    s.index.Upsert(
        index_pb2.UpsertRequest(
            collection="docs", items=[item(k, t, **m) for k, (t, m) in texts.items()]
        )
    )
    vec = s.embed.Embed(embed_pb2.EmbedRequest(texts=["a vector about gardening tools"])).vectors[0]
    s.index.Upsert(
        index_pb2.UpsertRequest(
            collection="docs", items=[item("e", "", list(vec.values), kind="code", year=2019)]
        )
    )
    assert s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs")).count == 5

    def search(**kw):
        return s.search.Search(
            search_pb2.SearchRequest(
                collection="docs", include_text=True, include_metadata=True, **kw
            )
        )

    r = search(text="python list", top_k=2)
    assert {h.id for h in r.hits} == {"c", "d"} and r.returned_k == 2 and r.exhaustive
    assert r.embedder == "fake@1" and r.hits[0].score >= r.hits[1].score
    filt = common_pb2.Filter(must=[cond("kind", EQ, "animal")], must_not=[cond("year", GT, 2021)])
    r = search(text="python list", top_k=3, filter=filt)
    assert [h.id for h in r.hits] == ["a"] and r.returned_k == 1
    assert r.hits[0].metadata["kind"] == "animal" and r.hits[0].text.startswith("the cat")
    r = search(vector=common_pb2.Vector(values=vec.values), top_k=1)
    assert r.hits[0].id == "e" and r.hits[0].score == pytest.approx(1.0, abs=1e-5)
    # replace by id, delete by id and by filter
    s.index.Upsert(index_pb2.UpsertRequest(collection="docs", items=[item("a", "a new text")]))
    got = s.index.Get(index_pb2.GetRequest(collection="docs", ids=["a", "zz"]))
    assert [i.text for i in got.items] == ["a new text"] and not got.items[0].metadata.fields
    assert (
        s.index.Delete(
            index_pb2.DeleteRequest(collection="docs", ids=common_pb2.IdList(ids=["b"]))
        ).deleted
        == 1
    )
    assert (
        s.index.Delete(
            index_pb2.DeleteRequest(
                collection="docs", filter=common_pb2.Filter(must=[cond("tags", EXISTS)])
            )
        ).deleted
        == 1
    )
    before = search(text="python list", top_k=10)
    assert {h.id for h in before.hits} == {"a", "c", "e"}

    server.restart()
    s = server.stubs
    after = s.search.Search(
        search_pb2.SearchRequest(collection="docs", text="python list", top_k=10)
    )
    assert [(h.id, round(h.score, 5)) for h in after.hits] == [
        (h.id, round(h.score, 5)) for h in before.hits
    ]
    assert s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs")).count == 3
    names = [
        c.name for c in s.index.ListCollections(index_pb2.ListCollectionsRequest()).collections
    ]
    assert names == ["docs"]
    s.index.DeleteCollection(index_pb2.DeleteCollectionRequest(name="docs"))
    assert (
        code_of(
            lambda: s.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"))
        )[0]
        == grpc.StatusCode.NOT_FOUND
    )


def test_health_and_reflection(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    h = health_pb2_grpc.HealthStub(server.stubs.channel)
    assert (
        h.Check(health_pb2.HealthCheckRequest(service="")).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    r = reflection_pb2_grpc.ServerReflectionStub(server.stubs.channel)
    reply = next(
        r.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    )
    names = {s.name for s in reply.list_services_response.service}
    assert {
        "ragplane.v1.EmbedService",
        "ragplane.v1.IndexService",
        "ragplane.v1.SearchService",
        "grpc.health.v1.Health",
    } <= names


BAD = [
    ("empty batch", lambda s: s.embed.Embed(embed_pb2.EmbedRequest(texts=[]))),
    ("oversized batch", lambda s: s.embed.Embed(embed_pb2.EmbedRequest(texts=["x"] * 5000))),
    ("huge text", lambda s: s.embed.Embed(embed_pb2.EmbedRequest(texts=["x" * 70000]))),
    (
        "unknown use case",
        lambda s: s.embed.Embed(embed_pb2.EmbedRequest(texts=["x"], use_case="nope")),
    ),
    (
        "no truncation, too long",
        lambda s: s.embed.Embed(embed_pb2.EmbedRequest(texts=["w " * 400], truncate=False)),
    ),
    (
        "wrong dim",
        lambda s: s.index.Upsert(
            index_pb2.UpsertRequest(collection="c", items=[item("1", vector=[0.1, 0.2])])
        ),
    ),
    (
        "nan",
        lambda s: s.index.Upsert(
            index_pb2.UpsertRequest(collection="c", items=[item("1", vector=[float("nan")] * 64)])
        ),
    ),
    (
        "inf",
        lambda s: s.index.Upsert(
            index_pb2.UpsertRequest(collection="c", items=[item("1", vector=[float("inf")] * 64)])
        ),
    ),
    (
        "duplicate ids",
        lambda s: s.index.Upsert(
            index_pb2.UpsertRequest(collection="c", items=[item("1", "a"), item("1", "b")])
        ),
    ),
    (
        "empty id",
        lambda s: s.index.Upsert(index_pb2.UpsertRequest(collection="c", items=[item("", "a")])),
    ),
    (
        "no vector nor text",
        lambda s: s.index.Upsert(index_pb2.UpsertRequest(collection="c", items=[item("1")])),
    ),
    ("empty upsert", lambda s: s.index.Upsert(index_pb2.UpsertRequest(collection="c"))),
    (
        "top_k 0",
        lambda s: s.search.Search(search_pb2.SearchRequest(collection="c", text="x", top_k=0)),
    ),
    (
        "top_k absurd",
        lambda s: s.search.Search(search_pb2.SearchRequest(collection="c", text="x", top_k=10**9)),
    ),
    ("no query", lambda s: s.search.Search(search_pb2.SearchRequest(collection="c", top_k=1))),
    (
        "query dim",
        lambda s: s.search.Search(
            search_pb2.SearchRequest(
                collection="c", vector=common_pb2.Vector(values=[1.0]), top_k=1
            )
        ),
    ),
    (
        "malformed filter op",
        lambda s: s.search.Search(
            search_pb2.SearchRequest(
                collection="c",
                text="x",
                top_k=1,
                filter=common_pb2.Filter(must=[common_pb2.Condition(field="a")]),
            )
        ),
    ),
    (
        "in without list",
        lambda s: s.search.Search(
            search_pb2.SearchRequest(
                collection="c", text="x", top_k=1, filter=common_pb2.Filter(must=[cond("a", IN, 3)])
            )
        ),
    ),
    (
        "unknown metric",
        lambda s: s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="m", metric=17)),
    ),
    (
        "unknown index type",
        lambda s: s.index.CreateCollection(
            index_pb2.CreateCollectionRequest(name="m", index_type=17)
        ),
    ),
    (
        "bad name",
        lambda s: s.index.CreateCollection(
            index_pb2.CreateCollectionRequest(name="no spaces/allowed")
        ),
    ),
    ("empty delete", lambda s: s.index.Delete(index_pb2.DeleteRequest(collection="c"))),
    (
        "empty filter delete",
        lambda s: s.index.Delete(
            index_pb2.DeleteRequest(collection="c", filter=common_pb2.Filter())
        ),
    ),
]


@pytest.mark.parametrize("label,call", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_invalid_argument_and_server_lives(server, label, call):
    s = server.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c"))
    code, details = code_of(lambda: call(s))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (label, code, details)
    assert details and "internal" not in details.lower()
    assert s.embed.Embed(embed_pb2.EmbedRequest(texts=["still alive"])).dim == 64


def test_missing_collection_is_not_found_and_duplicate_is_already_exists(server):
    s = server.stubs
    code, details = code_of(
        lambda: s.search.Search(search_pb2.SearchRequest(collection="nope", text="x", top_k=1))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in details
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c"))
    code, _ = code_of(lambda: s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="c")))
    assert code == grpc.StatusCode.ALREADY_EXISTS


def test_exist_ok_gets_the_collection_asked_for_and_never_another(server):
    s = server.stubs
    req = index_pb2.CreateCollectionRequest
    made = s.index.CreateCollection(req(name="c", exist_ok=True))
    item = common_pb2.Item(id="1", text="x")
    s.index.Upsert(index_pb2.UpsertRequest(collection="c", items=[item]))
    again = s.index.CreateCollection(req(name="c", exist_ok=True))
    assert again.count == 1 and again.created_at == made.created_at and again.dim == made.dim
    for other in (req(name="c", exist_ok=True, metric=index_pb2.METRIC_L2),
                  req(name="c", exist_ok=True, lexical_index=False),
                  req(name="c", exist_ok=True, chunking=index_pb2.Chunking(enabled=False)),
                  req(name="c", exist_ok=True, dim=8)):
        code, details = code_of(lambda o=other: s.index.CreateCollection(o))
        assert code == grpc.StatusCode.ALREADY_EXISTS and "'c'" in details, (other, details)
    code, _ = code_of(lambda: s.index.CreateCollection(req(name="c")))
    assert code == grpc.StatusCode.ALREADY_EXISTS


def test_invalid_utf8_gets_invalid_argument(server):
    # proto3 strings must be UTF-8: send raw bytes through a generic call.
    raw = b"\x0a\x03\xff\xfe\xfd"  # field 1 (texts), 3 bytes of invalid UTF-8
    call = server.stubs.channel.unary_unary(
        "/ragplane.v1.EmbedService/Embed",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    code, details = code_of(lambda: call(raw))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in details
    assert server.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["ok"])).dim == 64
