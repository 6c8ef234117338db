"""How LlamaIndex MetadataFilters become ragplane filters (no server): each operator, the
and / or / not trees the flat must / should / must_not form can say, and the refusals.
Their effect on a real collection: test_llama_index.py."""

from __future__ import annotations

import pytest
from llama_index.core.vector_stores.types import (
    FilterCondition,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from ragplane_client import filters as f
from ragplane_client.llama_index import to_filter
from ragplane_client.llama_index._nodes import plan_query


def mf(key, op, value) -> MetadataFilter:
    return MetadataFilter(key=key, operator=op, value=value)


def group(*filters, condition="and") -> MetadataFilters:
    return MetadataFilters(filters=list(filters), condition=condition)


@pytest.mark.parametrize(
    ("op", "value", "expected"),
    [
        ("==", "x", f.eq("k", "x")),
        ("!=", 1, f.ne("k", 1)),
        (">", 1.5, f.gt("k", 1.5)),
        (">=", 1, f.gte("k", 1)),
        ("<", "m", f.lt("k", "m")),
        ("<=", 1, f.lte("k", 1)),
        ("in", ["1", "2"], f.in_("k", ["1", "2"])),
        ("nin", [1], f.nin("k", [1])),
        ("in", 3, f.in_("k", [3])),  # a lone value is a list of one
        ("contains", "db", f.eq("k", "db")),
        ("any", ["a", "b"], f.in_("k", ["a", "b"])),
    ],
)
def test_each_operator(op, value, expected):
    assert to_filter(group(mf("k", op, value))) == {"must": [expected]}
    assert f.to_pb(to_filter(group(mf("k", op, value)))) is not None  # a valid ragplane filter


@pytest.mark.parametrize("op", ["all", "text_match", "text_match_insensitive", "is_empty"])
def test_other_operators_are_refused_by_name(op):
    with pytest.raises(ValueError, match=f"filter operator '{op}' \\(on key 'k'\\)"):
        to_filter(group(mf("k", op, ["v"] if op == "all" else "v")))


def test_conditions():
    a, b = mf("a", "==", 1), mf("b", "==", 2)
    assert to_filter(group(a, b)) == {"must": [f.eq("a", 1), f.eq("b", 2)]}
    assert to_filter(group(a, b, condition=FilterCondition.OR)) == {
        "should": [f.eq("a", 1), f.eq("b", 2)]
    }
    assert to_filter(group(a, b, condition="not")) == {"must_not": [f.eq("a", 1), f.eq("b", 2)]}
    assert to_filter(None) is None and to_filter(group()) is None
    assert to_filter(None, f.eq("d", 4)) == {"must": [f.eq("d", 4)]}


def test_nesting_that_the_flat_form_can_say():
    a, b, c, d = (mf(k, "==", i) for i, k in enumerate("abcd"))
    # AND(a, OR(b, c), NOT(d), AND(a)) -> must a, a; should b, c; must_not d
    nested = group(a, group(b, c, condition="or"), group(d, condition="not"), group(a))
    assert to_filter(nested) == {
        "must": [f.eq("a", 0), f.eq("a", 0)],
        "should": [f.eq("b", 1), f.eq("c", 2)],
        "must_not": [f.eq("d", 3)],
    }
    # OR(a, OR(b, c), AND(d)) -> should a, b, c, d
    assert to_filter(group(a, group(b, c, condition="or"), group(d), condition="or")) == {
        "should": [f.eq("a", 0), f.eq("b", 1), f.eq("c", 2), f.eq("d", 3)]
    }
    # NOT(a, OR(b, c)) -> none of a, b, c
    assert to_filter(group(a, group(b, c, condition="or"), condition="not")) == {
        "must_not": [f.eq("a", 0), f.eq("b", 1), f.eq("c", 2)]
    }
    # extra conditions (a query's doc_ids) join the must list
    assert to_filter(group(b, c, condition="or"), f.in_("ref_doc_id", ["x"])) == {
        "must": [f.in_("ref_doc_id", ["x"])],
        "should": [f.eq("b", 1), f.eq("c", 2)],
    }


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ("AND(OR(a,b), OR(c,d))", "one OR group per AND"),
        ("OR(AND(a,b), c)", "nested AND group inside OR"),
        ("NOT(AND(a,b))", "nested AND group inside NOT"),
        ("OR(NOT(a), b)", "nested NOT group inside OR"),
    ],
)
def test_nesting_that_it_cannot_say_is_refused(tree, message):
    a, b, c, d = (mf(k, "==", i) for i, k in enumerate("abcd"))
    trees = {
        "AND(OR(a,b), OR(c,d))": group(group(a, b, condition="or"), group(c, d, condition="or")),
        "OR(AND(a,b), c)": group(group(a, b), c, condition="or"),
        "NOT(AND(a,b))": group(group(a, b), condition="not"),
        "OR(NOT(a), b)": group(group(a, condition="not"), b, condition="or"),
    }
    with pytest.raises(ValueError, match=message):
        to_filter(trees[tree])


def test_query_plans():
    flt = group(mf("k", "==", 1))
    dense = plan_query(VectorStoreQuery(query_embedding=[0.1, 0.2], similarity_top_k=3), "rrf")
    assert dense.query == [0.1, 0.2]
    assert dense.options == {"mode": "dense", "filter": None, "top_k": 3}
    text = plan_query(
        VectorStoreQuery(query_str="q", mode="text_search", similarity_top_k=3, sparse_top_k=7),
        "weighted",
    )
    assert (text.query, text.options["mode"], text.options["top_k"]) == ("q", "lexical", 7)
    hybrid = VectorStoreQuery(query_str="q", query_embedding=[1.0], mode="hybrid", alpha=0.25,
                              similarity_top_k=3, hybrid_top_k=5, filters=flt)  # fmt: skip
    plan = plan_query(hybrid, "rrf")
    assert plan.query == "q"
    assert plan.options == {"mode": "hybrid", "filter": {"must": [f.eq("k", 1)]}, "top_k": 5,
                            "fusion": "rrf", "dense_weight": 0.25}  # fmt: skip
    assert (
        "dense_weight"
        not in plan_query(VectorStoreQuery(query_str="q", mode="hybrid"), "weighted").options
    )  # no alpha: the server's even split
