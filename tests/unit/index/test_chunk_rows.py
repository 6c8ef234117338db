"""The engine's chunk rows, with vectors chosen by hand: an item of several chunks is one
item everywhere (counts, Get, filters, deletes), ranks by its best chunk, and its hit's
passages are its best chunks even when the ranking never read them."""

from __future__ import annotations

import numpy as np
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.index import Engine, IndexType, Metric, Record
from ragplane.index.types import Chunking, Condition, Filter, FilterOp, Span

T = "t"


def unit(*v):
    a = np.float32(v)
    return a / np.linalg.norm(a)


@pytest.fixture
def eng(tmp_path):
    with Engine(tmp_path / "d") as e:
        e.create_collection(T, "c", dim=3, metric=Metric.COSINE, index_type=IndexType.FLAT,
                            embedder="fake@1", chunking=Chunking(True, 256, 32))
        yield e


def doc(text="alpha beta gamma delta epsilon", **md):
    # chunk 0 points at x, chunk 3 almost at x; the middle two elsewhere
    spans = [Span(0, 5, unit(1, 0, 0)), Span(6, 10, unit(0, 0, 1)),
             Span(11, 16, unit(0, 1, 1)), Span(17, 22, unit(1, 0.05, 0))]
    return Record("doc", None, text, md, chunks=spans)


def test_an_item_of_many_chunks_counts_once_everywhere(eng):
    eng.upsert(T, "c", [doc(kind="a"), Record("s", unit(0, 1, 0), "single", {"kind": "b"})])
    info = eng.describe(T, "c")
    assert (info.count, info.chunks) == (2, 5)
    flt = Filter(must=(Condition("kind", FilterOp.EQ, "a"),))
    assert eng.count_matching(T, "c", flt) == 1 and eng.count_matching(T, "c", None) == 2
    (got,) = eng.get(T, "c", ["doc"], include_vectors=True)
    assert got.text == "alpha beta gamma delta epsilon"
    np.testing.assert_allclose(got.vector, unit(1, 0, 0))  # chunk 0's
    assert [r.id for batch in eng.iter_records(T, "c") for r in batch] == ["doc", "s"]
    assert eng.delete(T, "c", filter=flt) == 1
    assert eng.describe(T, "c").chunks == 1


def test_passages_are_the_best_chunks_even_past_the_rows_read(eng):
    eng.upsert(T, "c", [doc()])
    # 40 items between the doc's best chunk and its second best: a ranking read 4 rows deep
    # never sees chunk 3
    others = [Record(f"o{i}", unit(1, 0.01 + 0.0001 * i, 0), "other", {}) for i in range(40)]
    eng.upsert(T, "c", others)
    q = np.float32([1, 0, 0])
    (res,) = eng.search(T, "c", q, 1, chunks_per_hit=2, include_text=True)
    hit = res.hits[0]
    assert hit.id == "doc" and [c.index for c in hit.chunks] == [0, 3]
    assert [c.text for c in hit.chunks] == ["alpha", "delta"]
    assert hit.chunks[0].score == pytest.approx(1.0) and hit.score == pytest.approx(1.0)
    (res,) = eng.search(T, "c", q, 3)
    assert [h.id for h in res.hits][0] == "doc" and len({h.id for h in res.hits}) == 3


def test_chunks_outside_their_text_are_refused(eng):
    bad = Record("x", None, "short", {}, chunks=[Span(0, 9, unit(1, 0, 0))])
    with pytest.raises(InvalidArgument, match="outside its text"):
        eng.upsert(T, "c", [bad])
    both = Record("x", unit(1, 0, 0), "short", {}, chunks=[Span(0, 5, unit(1, 0, 0))])
    with pytest.raises(InvalidArgument, match="not both"):
        eng.upsert(T, "c", [both])
