"""Search groups, as Qdrant's search groups: the best hits grouped by a metadata field.

Groups are cut from one ranking of items: a group ranks by its best hit, the first `limit`
groups are returned, and each holds its best min(`size`, its matching items) hits, exactly
the groups cut from the whole ranking. The ranking is read deeper until those first `limit`
groups are all full or the ranking runs out (or reaches MAX_TOP_K items: a group whose
members rank deeper than that comes back short). Items without the field (or with a
non-scalar value there) belong to no group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ragplane.core.errors import InvalidArgument
from ragplane.index.filters import field_path
from ragplane.index.types import HitGroup, SearchResult
from ragplane.index.validate import MAX_TOP_K

MAX_GROUP_SIZE = 100
_MISSING = object()


def check(field: str, size: int, limit: int, top_k: int) -> tuple[int, int]:
    """(group size, group limit) with defaults filled in; InvalidArgument when unusable."""
    if not field.strip():
        raise InvalidArgument(f"group_by {field!r} is not a metadata field name (dotted)")
    field_path(field, f"group_by {field!r}")  # the rule every metadata field name follows
    size, limit = size or 1, limit or top_k
    if not 1 <= size <= MAX_GROUP_SIZE:
        raise InvalidArgument(f"group_size must be from 0 to {MAX_GROUP_SIZE} (0 = 1), got {size}")
    if not 1 <= limit * size <= MAX_TOP_K:
        raise InvalidArgument(
            f"group_limit x group_size must be at most {MAX_TOP_K}, got {limit} x {size}"
        )
    return size, limit


def _value(metadata: Any, field: str) -> Any:
    v = metadata
    for part in field.split("."):
        if not isinstance(v, dict) or part not in v:
            return _MISSING
        v = v[part]
    return v if isinstance(v, (str, int, float, bool)) else _MISSING


def search_groups(
    run: Callable[[int], SearchResult], field: str, size: int, limit: int, top_k: int,
    include_metadata: bool,
) -> SearchResult:
    """Groups out of `run(k)` (a search of the k best items, with metadata)."""
    size, limit = check(field, size, limit, top_k)
    k = min(MAX_TOP_K, limit * size * 2)
    while True:
        res = run(k)
        chosen = _cut(res.hits, field, size, limit)
        # a prefix of the ranking names the first `limit` groups in their final order (a
        # group ranks by its first hit); only their members can still lie deeper
        done = len(chosen) == limit and all(len(m) == size for _, m in chosen)
        if done or res.returned_k < k or k >= MAX_TOP_K:
            break
        k = min(MAX_TOP_K, k * 4)
    out = [
        HitGroup(key=key[1], hits=tuple(h if include_metadata else replace(h, metadata={})
                                        for h in members))
        for key, members in chosen
    ]
    return SearchResult(hits=(), returned_k=sum(len(g.hits) for g in out),
                        exhaustive=res.exhaustive, groups=out)


def _cut(hits: Any, field: str, size: int, limit: int) -> list[tuple[Any, list]]:
    """The first `limit` groups of a ranking (by their best hit), each with its first `size`
    hits."""
    groups: dict[Any, list] = {}
    for h in hits:
        key = _value(h.metadata, field)
        if key is _MISSING:
            continue
        members = groups.get((type(key).__name__, key))
        if members is None:
            if len(groups) == limit:
                continue  # a group after the first `limit`: never returned
            members = groups[(type(key).__name__, key)] = []
        if len(members) < size:
            members.append(h)
    return list(groups.items())
