"""Fuzz every RPC of every registered service with malformed and extreme requests.

Requests come from the proto descriptors (tests/reliability/protogen.py), plus raw wire
bytes that do not parse at all. Whatever arrives, the answer must be OK or one of the
codes a client can act on — never INTERNAL or UNKNOWN (those mean a bug) — and the server
must still answer its health check afterwards. The run is derandomized, so CI sees the
same cases every time, and the number of cases is printed at the end.
"""

from __future__ import annotations

import collections
import os
import random

import grpc
import pytest
from google.protobuf import struct_pb2
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragplane.server.conversions import dict_to_struct
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import (
    admin_pb2,
    common_pb2,
    embed_pb2,
    index_pb2,
    memory_pb2,
    search_pb2,
)
from tests.reliability.protogen import messages, mutations

KEY = "fuzz-admin-key-0123456789abcdef"
AUTH = (("authorization", f"Bearer {KEY}"),)
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# Cases per RPC: 80 by default (`make test`); `make fuzz` sets RAGPLANE_FUZZ_PER_RPC for a run
# of >= 100,000 cases. Half are structured requests, half undecodable bytes.
PER_RPC = int(os.environ.get("RAGPLANE_FUZZ_PER_RPC", "80"))
MIN_CASES = int(os.environ.get("RAGPLANE_FUZZ_MIN_CASES", "500"))  # the run's floor
EXAMPLES = max(1, PER_RPC // 2)  # random requests per RPC
RAW_CASES = max(8, PER_RPC - EXAMPLES)  # undecodable requests per RPC
SERVICES = [
    embed_pb2.DESCRIPTOR.services_by_name["EmbedService"],
    index_pb2.DESCRIPTOR.services_by_name["IndexService"],
    search_pb2.DESCRIPTOR.services_by_name["SearchService"],
    memory_pb2.DESCRIPTOR.services_by_name["MemoryService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
]
METHODS = [m for s in SERVICES for m in s.methods]
CASES: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A server with a bootstrap admin key (so a fuzzed CreateKey cannot switch auth on
    half-way) and a few collections and memories for fuzzed names to land on."""
    root = tmp_path_factory.mktemp("fuzz")
    srv = InProcessServer(root / "data", bootstrap_admin_key=KEY, embed_queue_texts=4096)
    ch = srv.stubs
    ch.index.CreateCollection(index_pb2.CreateCollectionRequest(name="fz"), metadata=AUTH)
    ch.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name="fz-hnsw", index_type=index_pb2.INDEX_TYPE_HNSW),
        metadata=AUTH,
    )
    ch.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name="fz-ip4", dim=4, metric=index_pb2.METRIC_IP),
        metadata=AUTH,
    )
    for name in ("fz", "fz-hnsw"):
        ch.index.Upsert(
            index_pb2.UpsertRequest(
                collection=name,
                items=[
                    common_pb2.Item(
                        id=f"id{i}",
                        text=f"doc number {i} about topic {i % 3}",
                        metadata=dict_to_struct({"kind": ["a", "b"][i % 2], "year": 2000 + i}),
                    )
                    for i in range(20)
                ],
            ),
            metadata=AUTH,
        )
    ch.memory.Remember(
        memory_pb2.RememberRequest(namespace="fz.mem", text="the sky is blue"), metadata=AUTH
    )
    reflect = reflection_pb2_grpc.ServerReflectionStub(ch.channel)
    answer = next(
        iter(
            reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
    )
    registered = {s.name for s in answer.list_services_response.service}
    yield srv, registered, root
    srv.stop()


def _callable(channel: grpc.Channel, method, raw: bool = False):
    path = f"/{method.containing_service.full_name}/{method.name}"
    req = (lambda b: b) if raw else GetMessageClass(method.input_type).SerializeToString
    resp = GetMessageClass(method.output_type).FromString
    kind = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, method.server_streaming)]
    return kind(path, request_serializer=req, response_deserializer=resp)


def _invoke(channel: grpc.Channel, method, requests: list, raw: bool = False) -> grpc.StatusCode:
    call = _callable(channel, method, raw)
    arg = iter(requests) if method.client_streaming else requests[0]
    try:
        out = call(arg, metadata=AUTH, timeout=60)
        if method.server_streaming:
            list(out)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _check(channel: grpc.Channel, code: grpc.StatusCode, method, what) -> None:
    """The answer is one a client can act on, and the server still answers after it."""
    CASES[method.full_name] += 1
    assert code in ALLOWED, f"{method.full_name} answered {code.name} to {what!r:.600}"
    _alive(channel)


def _alive(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
        health_pb2.HealthCheckResponse.SERVING
    )


def _overrides(root):
    # Snapshot writes where it is told: keep it inside this test's directory (plus the
    # refusals: empty, an existing non-empty directory, a file).
    dirs = st.one_of(
        st.integers(0, 10**6).map(lambda i: str(root / "snaps" / f"s{i}")),
        st.sampled_from(["", str(root), str(root / "data" / "keys.db")]),
    )
    return {"ragplane.v1.SnapshotRequest.dir": dirs}


def _skip_unregistered(method, registered) -> None:
    if method.containing_service.full_name not in registered:
        pytest.skip(f"{method.containing_service.name} is not registered by create_server yet")


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name.split(".", 2)[-1])
def test_structured_fuzz(target, method):
    srv, registered, root = target
    _skip_unregistered(method, registered)
    strategy = messages(method.input_type, _overrides(root))
    batch = (
        st.lists(strategy, min_size=1, max_size=3)
        if method.client_streaming
        else (strategy.map(lambda m: [m]))
    )

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batch)
    def run(requests):
        _check(srv.stubs.channel, _invoke(srv.stubs.channel, method, requests), method, requests)

    run()
    _alive(srv.stubs.channel)


def _baselines(root) -> dict[str, list]:
    """A valid request per RPC (a list for client-streaming ones), to mutate field by field."""
    vec = common_pb2.Vector(values=[0.125] * 64)
    flt = common_pb2.Filter(
        must=[
            common_pb2.Condition(
                field="kind", op=common_pb2.FILTER_OP_EQ, value=struct_pb2.Value(string_value="a")
            )
        ],
        should=[
            common_pb2.Condition(
                field="year", op=common_pb2.FILTER_OP_GT, value=struct_pb2.Value(number_value=2003)
            )
        ],
        must_not=[common_pb2.Condition(field="tags", op=common_pb2.FILTER_OP_EXISTS)],
    )
    item = common_pb2.Item(
        id="m1",
        text="mutated item",
        vector=[0.5] * 64,
        metadata=dict_to_struct({"kind": "a", "year": 2001}),
    )
    embed = embed_pb2.EmbedRequest(texts=["hello world", "second text"], normalize=True)
    return {
        "Embed": [embed],
        "EmbedStream": [embed, embed],
        "CreateCollection": [
            index_pb2.CreateCollectionRequest(
                name="fz-new",
                metric=index_pb2.METRIC_L2,
                index_type=index_pb2.INDEX_TYPE_HNSW,
                dim=8,
                params=index_pb2.IndexParams(hnsw_m=8, hnsw_ef_search=16),
            )
        ],
        "DescribeCollection": [index_pb2.DescribeCollectionRequest(name="fz")],
        "Upsert": [index_pb2.UpsertRequest(collection="fz", items=[item])],
        "Delete": [index_pb2.DeleteRequest(collection="fz", filter=flt)],
        "Get": [index_pb2.GetRequest(collection="fz", ids=["id1", "id2"], include_vectors=True)],
        "Search": [
            search_pb2.SearchRequest(
                collection="fz",
                vector=vec,
                top_k=5,
                filter=flt,
                include_text=True,
                include_metadata=True,
            )
        ],
        "Remember": [
            memory_pb2.RememberRequest(
                namespace="fz.mem",
                text="water is wet",
                metadata=dict_to_struct({"kind": "a"}),
                importance=0.7,
                ttl_seconds=3600,
            )
        ],
        "Recall": [memory_pb2.RecallRequest(namespace="fz.mem", query="sky", top_k=3, filter=flt)],
        "Forget": [memory_pb2.ForgetRequest(namespace="fz.mem", filter=flt)],
        "ListMemories": [memory_pb2.ListMemoriesRequest(namespace="fz.mem", page_size=1)],
        "Rebuild": [
            admin_pb2.RebuildRequest(
                collection="fz-hnsw", index_type=index_pb2.INDEX_TYPE_HNSW, min_recall=0.5
            )
        ],
        "Snapshot": [admin_pb2.SnapshotRequest(dir=str(root / "snaps" / "base"))],
        "CreateKey": [admin_pb2.CreateKeyRequest(tenant="t1", scopes=["read"])],
        "RevokeKey": [admin_pb2.RevokeKeyRequest(key_id="000000000000")],
        "Flip": [admin_pb2.FlipRequest(use_case="embeddings")],
        "Unflip": [admin_pb2.UnflipRequest(use_case="embeddings")],
        "ShadowStatus": [admin_pb2.ShadowStatusRequest(use_case="embeddings")],
        "Compact": [admin_pb2.CompactRequest(collection="fz")],
        "Rollback": [admin_pb2.RollbackRequest(collection="fz-hnsw")],
    }


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name.split(".", 2)[-1])
def test_one_field_mutations(target, method):
    """Every field of a valid request, one at a time, set to each extreme value."""
    srv, registered, root = target
    _skip_unregistered(method, registered)
    base = _baselines(root).get(method.name) or [GetMessageClass(method.input_type)()]
    for path, mutated in mutations(base[-1]):
        if path.split("=")[0].endswith(".dir") or path.startswith("dir"):
            continue  # never let a fuzzed Snapshot write outside the test directory
        requests = [*base[:-1], mutated]
        ch = srv.stubs.channel
        _check(ch, _invoke(ch, method, requests), method, f"{path}: {mutated}")
    _alive(srv.stubs.channel)


def _raw_payloads(method, rng: random.Random) -> list[bytes]:
    """Bytes that are not a valid message of the method's input type (most of them)."""
    valid = GetMessageClass(method.input_type)().SerializeToString()
    out = [
        b"\xff\xff\xff\xff",  # an unterminated varint
        b"\x0a\x05abc",  # a string field longer than the message
        b"\x0a\x02\xff\xfe",  # field 1 as invalid UTF-8
        b"\x12\x02\xc3\x28",  # field 2 as invalid UTF-8
        b"\x0b",  # a start-group tag with no end
        b"\x0a" + b"\x80" * 11,  # an overlong length
        valid,
    ]
    while len(out) < RAW_CASES:
        n = rng.randrange(1, 64)
        out.append(bytes(rng.randrange(256) for _ in range(n)))
    return out


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name.split(".", 2)[-1])
def test_undecodable_requests(target, method):
    srv, registered, _ = target
    _skip_unregistered(method, registered)
    rng = random.Random(f"raw:{method.full_name}")
    for payload in _raw_payloads(method, rng):
        ch = srv.stubs.channel
        _check(ch, _invoke(ch, method, [payload], raw=True), method, payload)
    _alive(srv.stubs.channel)


def test_server_still_serves_and_report(target, capsys):
    srv, registered, _ = target
    _alive(srv.stubs.channel)
    r = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["still here"]), metadata=AUTH)
    assert r.dim == 64
    total = sum(CASES.values())
    with capsys.disabled():
        print(
            f"\nfuzz: {total} cases over {len(CASES)} RPCs "
            f"({', '.join(sorted(s.rsplit('.', 1)[-1] for s in registered))})"
        )
    assert total >= MIN_CASES
