"""Search groups, as Qdrant's search groups: the best hits grouped by a metadata field.

Groups are cut from one ranking of items, read deeper until `limit` groups of `size` hits
are full or the ranking runs out (or reaches MAX_TOP_K items). A group ranks by its best
hit; items without the field (or with a non-scalar value there) belong to no group.
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
        groups: dict[Any, list] = {}
        for h in res.hits:
            key = _value(h.metadata, field)
            if key is _MISSING:
                continue
            members = groups.setdefault((type(key).__name__, key), [])
            if len(members) < size:
                members.append(h if include_metadata else replace(h, metadata={}))
        full = sum(1 for m in groups.values() if len(m) == size)
        if full >= limit or res.returned_k < k or k >= MAX_TOP_K:
            break
        k = min(MAX_TOP_K, k * 4)
    chosen = list(groups.items())[:limit]  # insertion order: by each group's best hit
    out = [HitGroup(key=key[1], hits=tuple(members)) for key, members in chosen]
    return SearchResult(hits=(), returned_k=sum(len(g.hits) for g in out),
                        exhaustive=res.exhaustive, groups=out)
