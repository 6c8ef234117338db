"""Round trip of every message that crosses the proto <-> domain boundary."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import InvalidArgument
from index.types import (
    CollectionInfo,
    Condition,
    Filter,
    FilterOp,
    Hit,
    IndexParams,
    IndexType,
    Metric,
    Record,
    SearchResult,
)
from server import conversions as conv


def test_filter_round_trip_every_op():
    f = Filter(
        must=tuple(
            Condition(f"f{op.value}", op, v)
            for op, v in [
                (FilterOp.EQ, "x"),
                (FilterOp.NE, 3.0),
                (FilterOp.IN, ["a", "b"]),
                (FilterOp.NIN, [1.0, 2.0]),
                (FilterOp.GT, 1.5),
                (FilterOp.GTE, 2.0),
                (FilterOp.LT, "m"),
                (FilterOp.LTE, 9.0),
                (FilterOp.EXISTS, True),
            ]
        ),
        should=(Condition("a.b", FilterOp.EQ, True),),
        must_not=(Condition("z", FilterOp.EXISTS, None),),
    )
    assert conv.filter_from_pb(conv.filter_to_pb(f)) == f
    assert conv.filter_from_pb(conv.filter_to_pb(None)) is None


def test_collection_info_round_trip():
    c = CollectionInfo(
        "n",
        "default",
        8,
        Metric.L2,
        IndexType.HNSW,
        "fake@1",
        3,
        10,
        2,
        IndexParams(hnsw_m=16, ivf_nprobe=4),
        123.5,
    )
    assert conv.collection_info_from_pb(conv.collection_info_to_pb(c)) == c


def test_record_hit_and_search_result_round_trip():
    r = Record("id1", np.arange(4, dtype=np.float32), "text", {"a": 1.0, "b": {"c": ["x"]}})
    back = conv.item_to_record(conv.record_to_item(r))
    assert back.id == r.id and back.text == r.text and dict(back.metadata) == r.metadata
    np.testing.assert_array_equal(back.vector, r.vector)
    res = SearchResult([Hit("a", 0.5, "t", {"k": "v"}), Hit("b", 0.25)], 2, True)
    assert conv.search_result_from_pb(conv.search_result_to_pb(res)) == res


@pytest.mark.parametrize("bad", [99, -1])
def test_unknown_enums_are_invalid_argument(bad):
    with pytest.raises(InvalidArgument):
        conv.metric_from_pb(bad)
    with pytest.raises(InvalidArgument):
        conv.index_type_from_pb(bad)
