"""Round trip of every message that crosses the proto <-> domain boundary."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.index.types import (
    CollectionInfo,
    Condition,
    Filter,
    FilterOp,
    Fusion,
    FusionMethod,
    Hit,
    IndexParams,
    IndexType,
    Metric,
    Quantization,
    Record,
    SearchKnobs,
    SearchMode,
    SearchResult,
)
from ragplane.server import conversions as conv
from ragplane.server import conversions_search as conv_search
from ragplane.server.memory import Memory
from ragplane.v1 import common_pb2, index_pb2, search_pb2


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
    no_lexical = dataclasses.replace(c, lexical_index=False)
    assert conv.collection_info_from_pb(conv.collection_info_to_pb(no_lexical)) == no_lexical


def test_lexical_index_defaults_to_on():
    assert conv_search.lexical_index_from_pb(index_pb2.CreateCollectionRequest(name="c")) is True
    off = index_pb2.CreateCollectionRequest(name="c", lexical_index=False)
    assert conv_search.lexical_index_from_pb(off) is False


def test_record_hit_and_search_result_round_trip():
    r = Record("id1", np.arange(4, dtype=np.float32), "text", {"a": 1.0, "b": {"c": ["x"]}})
    back = conv.item_to_record(conv.record_to_item(r))
    assert back.id == r.id and back.text == r.text and dict(back.metadata) == r.metadata
    np.testing.assert_array_equal(back.vector, r.vector)
    res = SearchResult([Hit("a", 0.5, "t", {"k": "v"}), Hit("b", 0.25)], 2, True)
    assert conv.search_result_from_pb(conv.search_result_to_pb(res)) == res
    hybrid = SearchResult(
        [
            Hit("a", 0.03125, dense=0.75, lexical=4.5, fused=0.03125),
            Hit("b", 0.015625, dense=-0.5, lexical=0.0, fused=0.015625),  # 0 is not unset
            Hit("c", 2.5, lexical=2.5),
        ],
        3,
        False,
    )
    assert conv.search_result_from_pb(conv.search_result_to_pb(hybrid)) == hybrid
    pb = conv.hit_to_pb(Hit("d", 0.5, dense=0.5))
    assert pb.HasField("dense_score") and not pb.HasField("lexical_score")
    # every hit carries its metadata, empty or not, as it always has (clients read it)
    assert pb.HasField("metadata") and not pb.metadata.fields and not pb.chunks


@pytest.mark.parametrize("mode", list(SearchMode))
def test_search_mode_round_trip(mode):
    assert conv.search_mode_from_pb(conv.search_mode_to_pb(mode)) is mode


def test_search_mode_unset_is_dense():
    assert conv.search_mode_from_pb(search_pb2.SearchRequest().mode) is SearchMode.DENSE


@pytest.mark.parametrize(
    "f",
    [Fusion(), Fusion(FusionMethod.WEIGHTED, 10, 0.25), Fusion(FusionMethod.RRF, 1, 0.0)],
)
def test_fusion_round_trip(f):
    assert conv_search.fusion_from_pb(conv_search.fusion_to_pb(f)) == f


def test_fusion_unset_fields_take_defaults():
    assert conv_search.fusion_from_pb(common_pb2.Fusion()) == Fusion()
    # An explicit weight of 0 (all lexical) is kept, not mistaken for "unset".
    assert conv_search.fusion_from_pb(common_pb2.Fusion(dense_weight=0.0)).dense_weight == 0.0


def test_memory_round_trip():
    m = Memory(
        "m1",
        "ns",
        "text",
        {"k": "v"},
        0.75,
        10.0,
        20.0,
        0.0,
        0.5,
        0.25,
        0.125,
        dense=0.5,
        lexical=3.0,
        fused=None,
    )
    assert conv.memory_from_pb(conv.memory_to_pb(m)) == m
    dense_only = Memory("m2", "ns", "t", {}, 0.5, 1.0, 2.0, 3.0, 0.5, 0.5, 0.5, dense=0.5)
    assert conv.memory_from_pb(conv.memory_to_pb(dense_only)) == dense_only


@pytest.mark.parametrize("bad", [99, -1])
def test_unknown_enums_are_invalid_argument(bad):
    with pytest.raises(InvalidArgument):
        conv.metric_from_pb(bad)
    with pytest.raises(InvalidArgument):
        conv.index_type_from_pb(bad)
    with pytest.raises(InvalidArgument, match="mode"):
        conv.search_mode_from_pb(bad)
    with pytest.raises(InvalidArgument, match="fusion.method"):
        conv_search.fusion_from_pb(common_pb2.Fusion(method=bad))


def test_shadow_case_round_trip_with_classes_and_watch():
    from ragplane.server.shadow.types import (
        CaseStatus,
        ClassEvidence,
        FlipEvent,
        GateResult,
        ReleaseEvidence,
    )

    cls = ClassEvidence("window", 7, 0.25, 70, 0.9999, 0.99999, 1.02, 1.04, 1.01, 0.99, 31, 1,
                        2, True, False, True,
                        sampled=4, skipped_busy=1, busy_sampled=2)  # fmt: skip
    rel = ReleaseEvidence(
        "rs@2", 9, 0.9999, 0.99991, 0.99999, 0.98, 40, 0.9, 0.95, 1.0, 33, 1, 2, True, False,
        canonical="onnx@1", hardware="cpu x86_64 avx2", phase="watch", seconds=12.5,
        batches=28, last_error="ShadowOutputError: NaN", classes=(cls,), bb_time_ratio=1.01,
        sampled=20, compared=19, skipped_busy=5, busy_sampled=3,
    )  # fmt: skip
    case = CaseStatus(
        "embeddings", "flipped", "auto", 0.1, "onnx@1", "rs@2", "rs@2",
        gates=(GateResult("G1 agreement", True, "n=9", ""),), flip_eligible=True,
        releases=(rel,), history=(FlipEvent(1.5, "flip", "rs@2", False, "every gate"),),
        hardware="cpu x86_64 avx2", kernel="avx2",
        watch=(GateResult("watch G2", False, "v", "window: slow"),),
        barred="1 shadow error(s)", watch_releases=(rel,),
    )  # fmt: skip
    assert conv.shadow_case_from_pb(conv.shadow_case_to_pb(case)) == case


def test_search_params_round_trip_and_unset_fields_stay_unset():
    for knobs in (SearchKnobs(), SearchKnobs(ef_search=64), SearchKnobs(nprobe=3),
                  SearchKnobs(exact=True), SearchKnobs(oversampling=2.5),
                  SearchKnobs(ef_search=1, nprobe=2, exact=True, oversampling=4.0)):
        req = search_pb2.SearchRequest(collection="c", params=conv_search.knobs_to_pb(knobs))
        assert conv_search.knobs_from_pb(req) == knobs
    assert conv_search.knobs_from_pb(search_pb2.SearchRequest(collection="c")) is None
    # zero is a value (refused by the engine), not "unset"
    zero = search_pb2.SearchRequest(params=search_pb2.SearchParams(ef_search=0))
    assert conv_search.knobs_from_pb(zero) == SearchKnobs(ef_search=0)


def test_index_params_quantization_round_trip():
    for q in Quantization:
        p = IndexParams(hnsw_m=8, quantization=q)
        assert conv.params_from_pb(conv.params_to_pb(p)) == p
    assert conv.params_from_pb(index_pb2.IndexParams()).quantization == Quantization.NONE
    with pytest.raises(InvalidArgument, match="quantization 99 is unknown"):
        conv.params_from_pb(index_pb2.IndexParams(quantization=99))
