"""Metadata filters: a plain dict, or the helpers below that build one.

    {"must": [{"field": "year", "op": "gte", "value": 2020}],
     "should": [{"field": "lang", "op": "in", "value": ["en", "de"]}],
     "must_not": [{"field": "draft", "op": "eq", "value": True}]}

is the same filter as

    where(gte("year", 2020), should=[in_("lang", ["en", "de"])], must_not=[eq("draft", True)])

An item matches when every `must` condition holds, at least one `should` condition holds
(when there are any) and no `must_not` holds. Nested fields use dots ("author.name").
Operators: eq, ne (items without the field match), in, nin (value a list), gt, gte, lt,
lte (numbers or strings), exists (value true, the default, or false). Every search, recall,
delete and forget takes such a dict, a `ragplane_client.v1.common_pb2.Filter`, or None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format, struct_pb2

from ragplane_client.v1 import common_pb2

OPS = {
    "eq": common_pb2.FILTER_OP_EQ,
    "ne": common_pb2.FILTER_OP_NE,
    "in": common_pb2.FILTER_OP_IN,
    "nin": common_pb2.FILTER_OP_NIN,
    "gt": common_pb2.FILTER_OP_GT,
    "gte": common_pb2.FILTER_OP_GTE,
    "lt": common_pb2.FILTER_OP_LT,
    "lte": common_pb2.FILTER_OP_LTE,
    "exists": common_pb2.FILTER_OP_EXISTS,
}
CLAUSES = ("must", "should", "must_not")

Condition = dict[str, Any]


def eq(field: str, value: Any) -> Condition:
    return {"field": field, "op": "eq", "value": value}


def ne(field: str, value: Any) -> Condition:
    return {"field": field, "op": "ne", "value": value}


def in_(field: str, values: Sequence[Any]) -> Condition:
    return {"field": field, "op": "in", "value": list(values)}


def nin(field: str, values: Sequence[Any]) -> Condition:
    return {"field": field, "op": "nin", "value": list(values)}


def gt(field: str, value: Any) -> Condition:
    return {"field": field, "op": "gt", "value": value}


def gte(field: str, value: Any) -> Condition:
    return {"field": field, "op": "gte", "value": value}


def lt(field: str, value: Any) -> Condition:
    return {"field": field, "op": "lt", "value": value}


def lte(field: str, value: Any) -> Condition:
    return {"field": field, "op": "lte", "value": value}


def exists(field: str, present: bool = True) -> Condition:
    return {"field": field, "op": "exists", "value": present}


def where(
    *must: Condition, should: Sequence[Condition] = (), must_not: Sequence[Condition] = ()
) -> dict[str, list[Condition]]:
    """A filter dict: every positional condition must hold."""
    out: dict[str, list[Condition]] = {}
    for name, conds in (("must", must), ("should", should), ("must_not", must_not)):
        if conds:
            out[name] = list(conds)
    return out


def to_pb(f: Any) -> common_pb2.Filter | None:
    """The filter as its protobuf message; None stays None. Raises ValueError (naming
    the bad part) on an unknown clause, operator or a condition without a field."""
    if f is None or isinstance(f, common_pb2.Filter):
        return f
    if not isinstance(f, Mapping):
        raise ValueError(f"a filter is a dict with {', '.join(CLAUSES)}; got {type(f).__name__}")
    unknown = set(f) - set(CLAUSES)
    if unknown:
        raise ValueError(f"unknown filter clause(s) {sorted(unknown)}; use {', '.join(CLAUSES)}")
    out = common_pb2.Filter()
    for clause in CLAUSES:
        conds = f.get(clause) or ()
        if isinstance(conds, Mapping):
            conds = [conds]
        getattr(out, clause).extend(_condition(c, clause) for c in conds)
    return out


def _condition(c: Any, clause: str) -> common_pb2.Condition:
    if isinstance(c, common_pb2.Condition):
        return c
    if not isinstance(c, Mapping) or not c.get("field"):
        raise ValueError(f"each {clause} condition is a dict with field, op and value; got {c!r}")
    op = c.get("op", "eq")
    code = op if isinstance(op, int) else OPS.get(str(op).lower())
    if code is None:
        raise ValueError(f"unknown filter op {op!r} for field {c['field']!r}; use {sorted(OPS)}")
    out = common_pb2.Condition(field=str(c["field"]), op=code)
    if "value" in c:
        out.value.CopyFrom(to_value(c["value"]))
    return out


def to_value(x: Any) -> struct_pb2.Value:
    """A JSON-like Python value as google.protobuf.Value."""
    v = struct_pb2.Value()
    if x is None:
        v.null_value = struct_pb2.NULL_VALUE
    else:
        json_format.ParseDict(_jsonable(x), v)
    return v


def to_struct(d: Mapping[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if d:
        json_format.ParseDict(_jsonable(d), s)
    return s


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # a numpy scalar, without importing numpy
        return x.item()
    return x
