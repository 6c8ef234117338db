"""Metadata filters: validation and compilation to one SQLite expression.

A `Filter` is evaluated by SQLite's JSON functions over the `metadata` column of live
items, which yields the set of matching sequence ids; the FAISS search is then
restricted to that set, so a filtered search fills `top_k` whenever enough items match.

Semantics (chosen to match what Qdrant / MongoDB users expect):

* `eq` / `in` match a scalar field equal to the value, or an array field holding it.
  Types are compared strictly: ``1`` does not equal ``"1"`` nor ``true``.
* `ne` / `nin` are the negations of `eq` / `in`, so items lacking the field match them.
* `gt` / `gte` / `lt` / `lte` compare numbers with numbers and strings with strings;
  a field of another type does not match.
* `exists` (value ``True`` by default) matches a present, non-null field.
"""

from __future__ import annotations

import math
from typing import Any

from ragplane.core.errors import InvalidArgument
from ragplane.index.types import Condition, Filter, FilterOp

_SCALARS = (str, int, float, bool, type(None))
_NUM_TYPES = "('integer','real')"
_MAX_FIELD_LEN = 256


def _where(section: str, i: int, cond: Any) -> str:
    field = getattr(cond, "field", None)
    return f"filter condition {section}[{i}] (field {field!r})"


def _json_path(field: Any, where: str) -> str:
    if not isinstance(field, str) or not field:
        raise InvalidArgument(
            f"{where}: field name is empty; name a metadata field, e.g. 'author.name'"
        )
    if len(field) > _MAX_FIELD_LEN:
        raise InvalidArgument(f"{where}: field name longer than {_MAX_FIELD_LEN} characters")
    parts = field.split(".")
    for part in parts:
        if not part:
            raise InvalidArgument(f"{where}: field {field!r} has an empty path segment")
        if '"' in part or any(ord(c) < 32 for c in part):
            raise InvalidArgument(
                f"{where}: field {field!r} may not contain quotes or control characters"
            )
    return "$" + "".join(f'."{p}"' for p in parts)


def field_path(field: str, where: str = "") -> str:
    """The SQLite JSON path of a dotted metadata field ("a.b" -> '$."a"."b"'); `where`
    names it in the refusal of a bad one (default: "field '<name>'")."""
    return _json_path(field, where or f"field {field!r}")


def _check_scalar(value: Any, where: str) -> None:
    if not isinstance(value, _SCALARS):
        raise InvalidArgument(
            f"{where}: value {value!r} is a {type(value).__name__}; expected a string, number, "
            "bool or null"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{where}: value {value!r} is not a finite number")


def _scalar_match(
    vexpr: str, texpr: str, values: list[Any], args: list[Any], expr_args: tuple[Any, ...] = ()
) -> str:
    """SQL that is true when (value expression, JSON type expression) equals any of `values`.

    `expr_args` are the arguments of one use of `texpr` (and of `vexpr`), appended per use.
    """
    parts: list[str] = []
    strs = [v for v in values if isinstance(v, str)]
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    bools = {v for v in values if isinstance(v, bool)}
    for group, types in ((strs, "('text')"), (nums, _NUM_TYPES)):
        if group:
            parts.append(f"({texpr} IN {types} AND {vexpr} IN ({','.join('?' * len(group))}))")
            args.extend(expr_args)
            args.extend(expr_args)
            args.extend(group)
    for b in sorted(bools):
        parts.append(f"{texpr} = '{'true' if b else 'false'}'")
        args.extend(expr_args)
    if any(v is None for v in values):
        parts.append(f"{texpr} = 'null'")
        args.extend(expr_args)
    return "(" + " OR ".join(parts) + ")" if parts else "0"


def _condition_sql(cond: Any, where: str, args: list[Any]) -> str:
    if not isinstance(cond, Condition):
        raise InvalidArgument(f"{where}: expected a Condition, got {type(cond).__name__}")
    try:
        op = FilterOp(cond.op)
    except ValueError:
        ops = ", ".join(o.value for o in FilterOp)
        raise InvalidArgument(f"{where}: unknown op {cond.op!r}; expected one of {ops}") from None
    path = _json_path(cond.field, where)
    texpr = "json_type(metadata, ?)"
    vexpr = "json_extract(metadata, ?)"
    value = cond.value

    if op in (FilterOp.EQ, FilterOp.NE, FilterOp.IN, FilterOp.NIN):
        if op in (FilterOp.EQ, FilterOp.NE):
            _check_scalar(value, where)
            values = [value]
        else:
            if not isinstance(value, (list, tuple)):
                raise InvalidArgument(
                    f"{where}: op '{op.value}' needs a list of values, got {type(value).__name__}"
                )
            for v in value:
                _check_scalar(v, where)
            values = list(value)
        if not values:
            sql = "0"
        else:
            # a scalar field equal to a value, or an array field containing one
            top = _scalar_match(vexpr, texpr, values, args, (path,))
            args.extend([path, path])
            inner = _scalar_match("je.value", "je.type", values, args)
            sql = (
                f"({top} OR (json_type(metadata, ?) = 'array' AND EXISTS "
                f"(SELECT 1 FROM json_each(metadata, ?) AS je WHERE {inner})))"
            )
        if op in (FilterOp.NE, FilterOp.NIN):
            return f"NOT COALESCE({sql}, 0)"
        return f"COALESCE({sql}, 0)"

    if op in (FilterOp.GT, FilterOp.GTE, FilterOp.LT, FilterOp.LTE):
        sym = {FilterOp.GT: ">", FilterOp.GTE: ">=", FilterOp.LT: "<", FilterOp.LTE: "<="}[op]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise InvalidArgument(
                f"{where}: op '{op.value}' compares numbers or strings; got "
                f"{type(value).__name__} {value!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgument(f"{where}: value {value!r} is not a finite number")
        types = "('text')" if isinstance(value, str) else _NUM_TYPES
        args.extend([path, path, value])
        return (
            f"COALESCE((json_type(metadata, ?) IN {types} "
            f"AND json_extract(metadata, ?) {sym} ?), 0)"
        )

    # EXISTS
    if value is None:
        value = True
    if not isinstance(value, bool):
        raise InvalidArgument(f"{where}: op 'exists' takes true or false, got {value!r}")
    args.extend([path])
    present = "COALESCE(json_type(metadata, ?) NOT IN ('null'), 0)"
    return present if value else f"NOT {present}"


def compile_filter(flt: Filter | None) -> tuple[str, list[Any]]:
    """Validate `flt` and return (SQL boolean expression over `metadata`, its arguments).

    Raises InvalidArgument naming the offending condition. An empty filter is "1".
    """
    if flt is None:
        return "1", []
    if not isinstance(flt, Filter):
        raise InvalidArgument(f"filter must be a Filter, got {type(flt).__name__}")
    args: list[Any] = []
    clauses: list[str] = []
    for section in ("must", "should", "must_not"):
        conds = getattr(flt, section)
        if not isinstance(conds, (tuple, list)):
            raise InvalidArgument(f"filter.{section} must be a list of conditions")
        parts = [_condition_sql(c, _where(section, i, c), args) for i, c in enumerate(conds)]
        if not parts:
            continue
        if section == "must":
            clauses.extend(parts)
        elif section == "should":
            clauses.append("(" + " OR ".join(parts) + ")")
        else:
            clauses.append("NOT (" + " OR ".join(parts) + ")")
    return (" AND ".join(clauses) if clauses else "1"), args
