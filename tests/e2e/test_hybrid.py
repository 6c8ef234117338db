"""Lexical and hybrid search over gRPC: modes, fusion, per-hit scores, filters in every mode,
deletes, the opt-out, memory Recall modes, and fuzzed query text that never reaches INTERNAL."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.testkit.texts import corpus
from ragplane.v1 import common_pb2, index_pb2, memory_pb2, search_pb2

pytestmark = pytest.mark.e2e

DENSE, LEXICAL, HYBRID = (
    common_pb2.SEARCH_MODE_DENSE,
    common_pb2.SEARCH_MODE_LEXICAL,
    common_pb2.SEARCH_MODE_HYBRID,
)
IDENTIFIERS = ["SSL_CTX_set_options", "E1102", "getaddrinfo_v2", "Ωmega_42"]


def item(id, text, **meta):
    return common_pb2.Item(id=id, text=text, metadata=dict_to_struct(meta))


def search(server, text, mode, top_k=10, **kw):
    req = search_pb2.SearchRequest(collection="docs", text=text, top_k=top_k, mode=mode, **kw)
    return server.stubs.search.Search(req)


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


@pytest.fixture
def docs(server):
    s = server.stubs
    s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
    items = [item(f"p{i}", t, group=i % 3) for i, t in enumerate(corpus(200))]
    items += [
        item(f"id{i}", f"if the build fails, call {ident}", group=i % 3)
        for i, ident in enumerate(IDENTIFIERS)
    ]
    s.index.Upsert(index_pb2.UpsertRequest(collection="docs", items=items))
    return server


@pytest.mark.parametrize("i", range(len(IDENTIFIERS)))
def test_exact_tokens_are_found_by_lexical_and_hybrid(docs, i):
    lex = search(docs, IDENTIFIERS[i], LEXICAL)
    assert lex.hits[0].id == f"id{i}" and lex.exhaustive and lex.embedder == ""
    h = lex.hits[0]
    assert h.HasField("lexical_score") and h.score == h.lexical_score > 0
    assert not h.HasField("dense_score") and not h.HasField("fused_score")
    hyb = search(docs, IDENTIFIERS[i], HYBRID)
    assert f"id{i}" in [x.id for x in hyb.hits[:3]] and hyb.embedder
    assert all(
        x.HasField(f) for x in hyb.hits for f in ("dense_score", "lexical_score", "fused_score")
    )
    dense = search(docs, IDENTIFIERS[i], DENSE)
    assert all(x.HasField("dense_score") and not x.HasField("lexical_score") for x in dense.hits)


def test_mode_unset_is_dense_as_before(docs):
    old = docs.stubs.search.Search(search_pb2.SearchRequest(collection="docs", text="x", top_k=5))
    new = search(docs, "x", DENSE, top_k=5)
    assert [h.id for h in old.hits] == [h.id for h in new.hits]


def test_weighted_fusion_and_rrf_k_are_honoured(docs):
    all_lexical = common_pb2.Fusion(method=common_pb2.FUSION_METHOD_WEIGHTED, dense_weight=0.0)
    r = search(docs, "E1102", HYBRID, fusion=all_lexical)
    assert r.hits[0].id == "id1" and r.hits[0].fused_score == pytest.approx(1.0)
    rrf = common_pb2.Fusion(method=common_pb2.FUSION_METHOD_RRF, rrf_k=1, dense_weight=0.0)
    r = search(docs, "E1102", HYBRID, fusion=rrf)
    assert r.hits[0].fused_score == pytest.approx(2.0 / 2)  # 2 * (1 - w) / (k + rank 1)


def test_filters_apply_in_every_mode(docs):
    f = common_pb2.Filter(
        must=[common_pb2.Condition(field="group", op=common_pb2.FILTER_OP_EQ, value=py_to_value(1))]
    )
    for mode in (DENSE, LEXICAL, HYBRID):
        r = search(
            docs, "the function returns a value", mode, top_k=20, filter=f, include_metadata=True
        )
        assert r.returned_k == len(r.hits) > 0, mode
        assert all(h.metadata["group"] == 1 for h in r.hits), mode
    r = search(docs, "SSL_CTX_set_options", LEXICAL, filter=f)  # id0 is group 0
    assert "id0" not in [h.id for h in r.hits]


def test_deletes_vanish_from_lexical_and_hybrid(docs):
    docs.stubs.index.Delete(
        index_pb2.DeleteRequest(collection="docs", ids=common_pb2.IdList(ids=["id0"]))
    )
    assert not search(docs, "SSL_CTX_set_options", LEXICAL).hits
    assert "id0" not in [h.id for h in search(docs, "SSL_CTX_set_options", HYBRID).hits]


def test_bad_requests_are_invalid_argument_or_failed_precondition(docs):
    s = docs.stubs
    bad = [
        (
            search_pb2.SearchRequest(collection="docs", text="x", top_k=5, mode=7),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            search_pb2.SearchRequest(
                collection="docs",
                vector=common_pb2.Vector(values=[0.1] * 64),
                top_k=5,
                mode=LEXICAL,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            search_pb2.SearchRequest(
                collection="docs",
                text="x",
                top_k=5,
                mode=HYBRID,
                fusion=common_pb2.Fusion(dense_weight=1.5),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            search_pb2.SearchRequest(
                collection="docs",
                text="x",
                top_k=5,
                mode=HYBRID,
                fusion=common_pb2.Fusion(rrf_k=-1),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            search_pb2.SearchRequest(
                collection="docs",
                text="x",
                top_k=5,
                mode=HYBRID,
                fusion=common_pb2.Fusion(method=9),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            search_pb2.SearchRequest(collection="docs", text="  ", top_k=5, mode=LEXICAL),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            search_pb2.SearchRequest(collection="nope", text="x", top_k=5, mode=LEXICAL),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]
    for req, want in bad:
        code, details = code_of(lambda req=req: s.search.Search(req))
        assert code == want and details, (req, details)


def test_a_collection_without_lexical_index(server):
    s = server.stubs
    info = s.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name="plain", lexical_index=False)
    )
    assert not info.lexical_index
    assert s.index.CreateCollection(index_pb2.CreateCollectionRequest(name="rich")).lexical_index
    s.index.Upsert(index_pb2.UpsertRequest(collection="plain", items=[item("a", "some words")]))
    for mode in (LEXICAL, HYBRID):
        req = search_pb2.SearchRequest(collection="plain", text="words", top_k=1, mode=mode)
        code, details = code_of(lambda req=req: s.search.Search(req))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "lexical" in details
    req = search_pb2.SearchRequest(collection="plain", text="words", top_k=1)
    assert s.search.Search(req).hits[0].id == "a"


def test_memory_recall_in_every_mode(server):
    s = server.stubs
    facts = ["the deploy window is friday at noon", "the user prefers dark mode", "E1102 flaky"]
    for t in facts:
        s.memory.Remember(memory_pb2.RememberRequest(namespace="agent", text=t))

    def recall(query, mode):
        req = memory_pb2.RecallRequest(namespace="agent", query=query, top_k=3, mode=mode)
        return s.memory.Recall(req).memories

    lex = recall("friday deploy", LEXICAL)
    assert [m.text for m in lex] == [facts[0]]
    assert lex[0].parts.relevance == pytest.approx(1.0) and lex[0].parts.HasField("lexical")
    assert not lex[0].parts.HasField("dense")
    hyb = recall("E1102", HYBRID)
    assert hyb[0].text == facts[2] and hyb[0].parts.HasField("fused")
    assert all(m.parts.HasField("dense") and m.parts.HasField("lexical") for m in hyb)
    dense = recall(facts[1], DENSE)
    assert dense[0].text == facts[1] and not dense[0].parts.HasField("lexical")


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.text(max_size=200), mode=st.sampled_from([LEXICAL, HYBRID]))
@example(text="(" * 10_000, mode=LEXICAL)
@example(text='"' * 10_000, mode=HYBRID)
@example(text='NEAR(a b, 2) AND NOT (c OR "d', mode=LEXICAL)
@example(text="!@#$%^&*()_+-=[]{};':,./<>?" * 400, mode=HYBRID)
@example(text="x" * 5000, mode=LEXICAL)
@example(text="\x00 col:a ^b c* -d", mode=HYBRID)
def test_fuzzed_query_text_never_breaks_the_server(docs, text, mode):
    try:
        r = search(docs, text, mode, top_k=5)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    else:
        assert r.returned_k == len(r.hits) <= 5
