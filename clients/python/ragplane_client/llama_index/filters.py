"""LlamaIndex `MetadataFilters` as a ragplane filter dict (see ragplane_client.filters).

A ragplane filter is flat: every `must` condition holds, at least one `should` holds (when
there are any) and no `must_not` holds. LlamaIndex's trees map onto it as follows:

* AND: its conditions go to `must`; a nested AND is merged into it, a nested NOT adds its
  `must_not`, and one nested OR group (of plain conditions) becomes the `should` list.
* OR: its conditions (or nested ORs, or one-condition groups) go to `should`.
* NOT (LlamaIndex: none of its filters holds): its conditions, and those of nested ORs, go
  to `must_not`.

Anything that the flat form cannot say (two OR groups under one AND, an AND inside an OR,
NOT of an AND) raises ValueError rather than being approximated.

Operators: == eq, != ne, > gt, >= gte, < lt, <= lte, in, nin map one to one. `contains`
(an array field holds the value) maps to eq and `any` (an array field holds one of the
values) to in, since ragplane's eq / in also match array fields that hold the value; on a
scalar field they are plain equality, not substring matches. `all`, `text_match`,
`text_match_insensitive` and `is_empty` have no exact equivalent and are refused by name
(`is_empty` also matches "" and [], which ragplane's `exists` does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

OPERATORS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "eq",
    FilterOperator.NE: "ne",
    FilterOperator.GT: "gt",
    FilterOperator.GTE: "gte",
    FilterOperator.LT: "lt",
    FilterOperator.LTE: "lte",
    FilterOperator.IN: "in",
    FilterOperator.NIN: "nin",
    FilterOperator.CONTAINS: "eq",
    FilterOperator.ANY: "in",
}
_LIST_OPS = {FilterOperator.IN, FilterOperator.NIN, FilterOperator.ANY}

Condition = dict[str, Any]


@dataclass
class _Flat:
    must: list[Condition] = field(default_factory=list)
    should: list[Condition] = field(default_factory=list)
    must_not: list[Condition] = field(default_factory=list)

    def single(self) -> Condition | None:
        """The one condition this group says, when it is a plain condition."""
        conds = self.must + self.should
        if len(conds) == 1 and not self.must_not:
            return conds[0]
        return None


def to_filter(filters: MetadataFilters | None, *must: Condition) -> dict[str, Any] | None:
    """The ragplane filter dict of `filters` with the extra `must` conditions (None when
    there is nothing to filter on). Raises ValueError naming a refused operator or
    condition, or a nesting the flat form cannot say."""
    flat = _flatten(filters) if filters is not None else _Flat()
    flat.must.extend(must)
    out = {k: v for k, v in vars(flat).items() if v}
    return out or None


def condition(f: MetadataFilter) -> Condition:
    """One LlamaIndex MetadataFilter as a ragplane condition dict."""
    op = OPERATORS.get(FilterOperator(f.operator))
    if op is None:
        raise ValueError(
            f"filter operator {FilterOperator(f.operator).value!r} (on key {f.key!r}) is not "
            f"supported by ragplane; use one of {sorted(o.value for o in OPERATORS)}"
        )
    value = f.value
    if f.operator in _LIST_OPS and not isinstance(value, list | tuple):
        value = [value]
    return {"field": f.key, "op": op, "value": list(value) if op in ("in", "nin") else value}


def _flatten(filters: MetadataFilters) -> _Flat:
    cond = FilterCondition(filters.condition or FilterCondition.AND)
    if cond is FilterCondition.AND:
        return _flatten_and(filters.filters)
    if cond is FilterCondition.OR:
        return _Flat(should=[c for f in filters.filters for c in _alternatives(f, "OR")])
    if cond is FilterCondition.NOT:
        return _Flat(must_not=[c for f in filters.filters for c in _alternatives(f, "NOT")])
    raise ValueError(f"filter condition {cond.value!r} is not supported by ragplane")


def _flatten_and(children: list[Any]) -> _Flat:
    out = _Flat()
    for f in children:
        if not isinstance(f, MetadataFilters):
            out.must.append(condition(f))
            continue
        sub = _flatten(f)
        out.must += sub.must
        out.must_not += sub.must_not
        if sub.should and out.should:
            raise ValueError(
                "ragplane filters hold one OR group per AND; combine the OR groups into one "
                "or run separate queries"
            )
        out.should = out.should or sub.should
    return out


def _alternatives(f: Any, where: str) -> list[Condition]:
    """The conditions any one of which `f` says, for an OR (at least one holds) or a NOT
    (none holds) around it: a plain condition, a nested OR of them, or a group of one."""
    if not isinstance(f, MetadataFilters):
        return [condition(f)]
    sub = _flatten(f)
    one = sub.single()
    if one is not None:
        return [one]
    if sub.should and not sub.must and not sub.must_not:
        return sub.should
    raise ValueError(
        f"a nested {FilterCondition(f.condition or 'and').value.upper()} group inside {where} "
        "cannot be said by a ragplane filter (must / should / must_not, not nested); "
        "flatten it, e.g. NOT(a AND b) as separate queries"
    )
