"""The console's pure parts: the text cut at chunk offsets, filters typed as JSON, the
charts' prefix grid, and store URLs without their password."""

from __future__ import annotations

import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.index.pg.log import redact
from ragplane.index.types import Condition, Filter, FilterOp
from ragplane.server.console.playground import CONTEXT, parse_filter, segments
from ragplane.server.console.series import grid


def test_segments_mark_exactly_the_chunks_offsets():
    text = "naïve café 日本語 " * 5  # code points, not bytes
    segs = segments(text, [(0, 6, 20), (1, 15, 30)])
    assert "".join(s.text for s in segs) == text
    marked = [(s.start, s.end, s.chunks) for s in segs if s.marked]
    assert marked == [(6, 15, "0"), (15, 20, "0 1"), (20, 30, "1")]
    assert all(text[s.start : s.end] == s.text for s in segs)


def test_segments_of_a_long_text_keep_the_chunk_and_elide_the_rest():
    text = "a" * 5000 + "CHUNK" + "b" * 5000
    segs = segments(text, [(3, 5000, 5005)])
    mark = next(s for s in segs if s.marked)
    assert (mark.start, mark.end, mark.text) == (5000, 5005, "CHUNK")
    assert sum(len(s.text) for s in segs) < 2 * CONTEXT + 20


def test_filters_typed_as_json():
    f = parse_filter('{"must": [{"field": "lang", "op": "eq", "value": "en"}], '
                     '"must_not": [{"field": "n", "op": "in", "value": [1, 2]}]}')
    assert f == Filter(must=(Condition("lang", FilterOp.EQ, "en"),),
                       must_not=(Condition("n", FilterOp.IN, [1, 2]),))
    assert parse_filter("  ") is None
    for bad in ("{", '{"may": []}', '{"must": [{"op": "eq"}]}', '{"must": [{"field": "x", '
                '"op": "like"}]}'):
        with pytest.raises(InvalidArgument):
            parse_filter(bad)


def test_grid_ends_at_every_timing_and_stays_small():
    assert grid(5, 40) == [1, 2, 3, 4, 5]
    g = grid(10_000, 40)
    assert g[0] == 1 and g[-1] == 10_000 and len(g) <= 40 and g == sorted(set(g))
    assert sum(g) < 6 * 10_000  # what the chart costs to estimate, in timings


def test_store_urls_lose_their_password():
    """What the store page shows of a PostgreSQL store (Backend.where) names it without
    the password."""
    assert redact("postgresql://rp:s3cret@db:5432/rag") == "postgresql://rp@db:5432/rag"
    assert redact("postgresql://db/rag") == "postgresql://@db:5432/rag"
    assert "s3cret" not in redact("host=db dbname=rag user=rp password=s3cret")
