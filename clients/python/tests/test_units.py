"""What the client builds before any call: filters from dicts and helpers, upsert batches by
count and bytes, argument errors, the retry policy's waits. No server."""

from __future__ import annotations

import grpc
import pytest

from ragplane_client import Item, RetryPolicy, SearchParams
from ragplane_client import _requests as req
from ragplane_client import filters as f
from ragplane_client._transport import retry_after
from ragplane_client.v1 import common_pb2


def test_the_dict_syntax_and_the_helpers_build_the_same_filter():
    d = {
        "must": [{"field": "year", "op": "gte", "value": 2020}],
        "should": [{"field": "lang", "op": "in", "value": ["en", "de"]}],
        "must_not": [{"field": "draft", "op": "eq", "value": True}],
    }
    h = f.where(
        f.gte("year", 2020), should=[f.in_("lang", ("en", "de"))], must_not=[f.eq("draft", True)]
    )
    assert d == h
    pb = f.to_pb(d)
    assert pb == f.to_pb(h)
    assert pb.must[0].op == common_pb2.FILTER_OP_GTE and pb.must[0].value.number_value == 2020
    assert [v.string_value for v in pb.should[0].value.list_value.values] == ["en", "de"]
    assert pb.must_not[0].value.bool_value is True
    assert f.to_pb(None) is None and f.to_pb(pb) is pb


def test_every_operator_and_null_values():
    conds = [
        f.eq("a", None),
        f.ne("a", 1),
        f.in_("a", [1]),
        f.nin("a", [2]),
        f.gt("a", 1),
        f.gte("a", 1),
        f.lt("a", "m"),
        f.lte("a", 1.5),
        f.exists("a", False),
    ]
    pb = f.to_pb(f.where(*conds))
    assert [c.op for c in pb.must] == list(range(1, 10))  # FILTER_OP_EQ .. FILTER_OP_EXISTS
    assert pb.must[0].value.WhichOneof("kind") == "null_value"
    assert f.to_pb({"must": {"field": "a", "op": "EQ", "value": 1}}).must[0].op == 1
    assert not f.to_pb({"must": [{"field": "a", "op": "exists"}]}).must[0].HasField("value")


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"musts": []}, "unknown filter clause"),
        ({"must": [{"op": "eq", "value": 1}]}, "field, op and value"),
        ({"must": [{"field": "a", "op": "~", "value": 1}]}, "unknown filter op"),
        ([f.eq("a", 1)], "a filter is a dict"),
    ],
)
def test_bad_filters_are_refused_before_any_call(bad, message):
    with pytest.raises(ValueError, match=message):
        f.to_pb(bad)


def test_upsert_batches_split_by_count_and_by_bytes():
    items = [{"id": str(i), "text": "x" * 100} for i in range(10)]
    by_count = list(req.upsert_batches("c", items, batch_size=4, batch_bytes=1 << 20))
    assert [len(b.items) for b in by_count] == [4, 4, 2]
    by_bytes = list(req.upsert_batches("c", items, batch_size=100, batch_bytes=350))
    assert [len(b.items) for b in by_bytes] == [3, 3, 3, 1]
    assert all(sum(it.ByteSize() for it in b.items) <= 350 for b in by_bytes)
    huge = list(req.upsert_batches("c", [Item("big", "y" * 1000), Item("s")], 10, 100))
    assert [[it.id for it in b.items] for b in huge] == [["big"], ["s"]]
    assert list(req.upsert_batches("c", [], 10, 10)) == []
    with pytest.raises(ValueError):
        list(req.upsert_batches("c", items, 0, 10))


def test_items_from_dataclasses_dicts_and_messages():
    a = req.item_pb(Item("1", "t", vector=[1, 2], metadata={"k": [1, {"x": None}]}))
    b = req.item_pb(
        {"id": "1", "text": "t", "vector": (1.0, 2.0), "metadata": {"k": [1, {"x": None}]}}
    )
    assert a == b and list(a.vector) == [1.0, 2.0]
    assert req.item_pb(a) is a


def test_search_request_options():
    r = req.search(
        "c",
        [0.5, 0.25],
        top_k=3,
        mode="hybrid",
        fusion="rrf",
        rrf_k=7,
        dense_weight=0.2,
        chunks_per_hit=2,
        group_by="g",
        group_size=2,
    )
    assert r.WhichOneof("query") == "vector" and list(r.vector.values) == [0.5, 0.25]
    assert (r.top_k, r.mode, r.chunks_per_hit, r.group_by, r.group_size) == (3, 3, 2, "g", 2)
    assert r.fusion.method == common_pb2.FUSION_METHOD_RRF and r.fusion.rrf_k == 7
    assert r.fusion.dense_weight == pytest.approx(0.2)
    plain = req.search("c", "text")
    assert plain.text == "text" and not plain.HasField("fusion") and plain.include_text
    with pytest.raises(ValueError, match="unknown fusion"):
        req.search("c", "t", fusion="max")


def test_search_params_set_only_the_fields_given():
    r = req.search("c", "t", params=SearchParams(ef_search=256, oversampling=2.5))
    p = r.params
    assert p.HasField("ef_search") and p.ef_search == 256 and p.oversampling == 2.5
    assert not p.HasField("nprobe") and not p.exact
    d = req.search("c", "t", params={"nprobe": 4, "exact": False}).params
    assert d.nprobe == 4 and not d.HasField("ef_search") and not d.HasField("oversampling")
    assert not req.search("c", "t").HasField("params")
    with pytest.raises(ValueError, match="unknown search params"):
        req.search("c", "t", params={"hnsw_ef": 4})


class _Err(grpc.RpcError):
    def __init__(self, code, trailers=()):
        self._code, self._trailers = code, trailers

    def code(self):
        return self._code

    def trailing_metadata(self):
        return self._trailers


def test_retry_policy_waits_and_bounds():
    p = RetryPolicy(max_attempts=3, initial_backoff=0.1, max_backoff=0.3, max_retry_after=2)
    assert p.delay(0, 1.5) == 1.5 and p.delay(0, 60) == 2
    assert 0.05 <= p.delay(0, None) <= 0.1 and 0.15 <= p.delay(5, None) <= 0.3
    busy, down = _Err(grpc.StatusCode.RESOURCE_EXHAUSTED), _Err(grpc.StatusCode.UNAVAILABLE)
    assert p.retries(busy, 0, idempotent=False) and p.retries(down, 1, idempotent=True)
    assert not p.retries(down, 0, idempotent=False) and not p.retries(busy, 2, idempotent=True)
    assert not p.retries(_Err(grpc.StatusCode.INTERNAL), 0, idempotent=True)
    assert retry_after(_Err(busy.code(), (("retry-after", "0.250"),))) == 0.25
    assert retry_after(_Err(busy.code(), (("grpc-retry-pushback-ms", "1500"),))) == 1.5
    assert retry_after(_Err(busy.code(), (("retry-after", "soon"),))) is None
    assert retry_after(busy) is None


def test_the_furthest_token_is_kept():
    from ragplane_client._ops import newer

    assert newer("", "ab.7") == "ab.7"
    assert newer("ab.7", "") == "ab.7"
    assert newer("ab.10", "ab.9") == "ab.10"  # by position, not as strings
    assert newer("ab.9", "ab.10") == "ab.10"
    assert newer("ab.9", "cd.1") == "cd.1"  # another store: the latest one
