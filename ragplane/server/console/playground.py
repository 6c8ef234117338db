"""The search playground: one query against a collection in dense, lexical and hybrid
mode side by side, each through `CollectionService.search` (the Search RPC's function),
with the hits' chunks marked in the item's text at the offsets the search returned."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import numpy as np
from starlette.requests import Request

from ragplane.core.errors import InvalidArgument, RagplaneError
from ragplane.index.types import Condition, Filter, FilterOp, Hit, SearchMode, SearchResult
from ragplane.server.collections import CollectionService, Grouping

MODES = ("dense", "lexical", "hybrid")
CONTEXT = 240  # characters of the item's text shown around its chunks
WHOLE = 800  # an item this short is shown whole


@dataclass(frozen=True)
class Segment:
    text: str
    start: int  # offsets into the item's text (code points)
    end: int
    marked: bool
    chunks: str = ""  # the indices of the chunks that cover it, "0 2"


def segments(text: str, spans: list[tuple[int, int, int]]) -> list[Segment]:
    """`text` cut at the chunks' offsets (index, start, end): marked where a chunk covers
    it; far from any chunk, elided to CONTEXT characters each side."""
    cuts = sorted({0, len(text), *(p for _, s, e in spans for p in (s, e))})
    out: list[Segment] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        cover = [str(i) for i, s, e in spans if s <= a and b <= e]
        out.append(Segment(text[a:b], a, b, bool(cover), " ".join(cover)))
    if len(text) <= WHOLE:
        return out
    shown = []
    for i, seg in enumerate(out):
        if seg.marked or not spans:
            shown.append(seg if seg.marked else _head(seg))
            continue
        before = i + 1 < len(out) and out[i + 1].marked
        after = i > 0 and out[i - 1].marked
        t = seg.text
        if len(t) > 2 * CONTEXT:
            t = (t[:CONTEXT] if after else "") + " … " + (t[-CONTEXT:] if before else "")
        shown.append(Segment(t, seg.start, seg.end, False))
    return shown


def _head(seg: Segment) -> Segment:
    t = seg.text if len(seg.text) <= WHOLE else seg.text[:WHOLE] + " …"
    return Segment(t, seg.start, seg.end, False)


def parse_filter(raw: str) -> Filter | None:
    """A filter typed as JSON: {"must": [{"field", "op", "value"}], "should", "must_not"}."""
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"the filter is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"must", "should", "must_not"}:
        raise InvalidArgument('the filter is an object of "must", "should", "must_not" lists')
    parts: dict[str, tuple[Condition, ...]] = {}
    for part, conds in data.items():
        if not isinstance(conds, list):
            raise InvalidArgument(f"filter {part} must be a list of conditions")
        try:
            parts[part] = tuple(
                Condition(str(c["field"]), FilterOp(c.get("op", "eq")), c.get("value"))
                for c in conds
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"filter {part}: each condition is {{\"field\", \"op\", \"value\"}} with op one "
                f"of {', '.join(o.value for o in FilterOp)} ({exc})"
            ) from None
    return Filter(**parts)


def parse_vector(raw: str) -> np.ndarray | None:
    if not raw.strip():
        return None
    try:
        values = json.loads(raw if raw.strip().startswith("[") else f"[{raw}]")
        return np.asarray(values, dtype=np.float32)
    except (ValueError, TypeError):
        raise InvalidArgument("the vector is a list of numbers: [0.1, -0.2, ...]") from None


def hit_view(hit: Hit) -> dict[str, Any]:
    spans = [(c.index, c.start, c.end) for c in hit.chunks]
    return {
        "id": hit.id, "score": hit.score, "dense": hit.dense, "lexical": hit.lexical,
        "fused": hit.fused, "metadata": dict(hit.metadata), "chunks": hit.chunks,
        "segments": segments(hit.text, spans), "length": len(hit.text),
    }


def result_view(result: SearchResult) -> dict[str, Any]:
    return {
        "hits": [hit_view(h) for h in result.hits],
        "groups": [(g.key, [hit_view(h) for h in g.hits]) for g in result.groups],
        "exhaustive": result.exhaustive, "returned_k": result.returned_k,
    }


def _num(q: dict[str, str], name: str, default: int) -> int:
    raw = q[name].strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise InvalidArgument(f"{name} must be a whole number, got {raw!r}") from None


class Playground:
    def __init__(self, collections: CollectionService) -> None:
        self.collections = collections

    def page(self, request: Request, form: dict[str, str]):
        """The query form, and a column per mode that loads its own results (`results`):
        the three searches run at once, and the page shows before the slowest ends."""
        names = [c.name for c in self.collections.list()]
        q = _query(form)
        q["collection"] = q["collection"] or (names[0] if names else "")
        modes = [m for m in MODES if form.get(m)] or list(MODES)
        asked = bool(form.get("text") or form.get("vector"))
        query = urlencode({k: v for k, v in q.items() if v})
        return "playground.html", {"names": names, "q": q, "modes": modes, "asked": asked,
                                   "query": query}

    def results(self, request: Request, form: dict[str, str]):
        """One mode's results (an htmx fragment of the playground)."""
        mode = form.get("mode", "")
        if mode not in MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        return "_mode.html", {"mode": mode, "r": self._run(_query(form), mode)}

    def _run(self, q: dict[str, str], mode: str) -> dict[str, Any]:
        try:
            vector = parse_vector(q["vector"])
            grouping = Grouping(q["group_by"].strip(), _num(q, "group_size", 0),
                                _num(q, "group_limit", 0))
            result, embedder = self.collections.search(
                q["collection"], text=q["text"] if vector is None else None, vector=vector,
                mode=SearchMode(mode), top_k=_num(q, "top_k", 5),
                filter=parse_filter(q["filter"]), include_text=True, include_metadata=True,
                chunks_per_hit=_num(q, "chunks", 1), grouping=grouping,
            )
        except RagplaneError as exc:  # this mode's refusal; the other columns still show
            return {"error": str(exc)}
        return {"embedder": embedder, **result_view(result)}


def _query(form: dict[str, str]) -> dict[str, str]:
    return {k: form.get(k, "") for k in ("collection", "text", "vector", "filter", "group_by",
                                         "top_k", "group_size", "group_limit", "chunks")}
