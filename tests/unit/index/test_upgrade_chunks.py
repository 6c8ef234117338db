"""A data directory written before chunking (schema version 2, committed under data/) opens
upgraded in place: its collections keep what they had (chunking off, one vector per item,
hits without passages), every item and its search still answer the same, and the upgraded
store takes chunked items beside the old ones. Then over gRPC: a new collection in the
same store chunks by default, an old one does not."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ragplane.index import Engine, Kind
from ragplane.index.store import DB_NAME, SCHEMA_VERSION
from ragplane.index.types import Record, Span
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import index_pb2
from tests.lexical_consistency import assert_lexical_matches_items

DATA = Path(__file__).parent / "data"
T = "default"


@pytest.fixture
def v2_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(DATA / "store_v2", d)
    return d


def _schema(d: Path) -> tuple[int, set[str], set[str]]:
    db = sqlite3.connect(d / DB_NAME)
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        cols = {r[1] for r in db.execute("PRAGMA table_info(items)")}
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return version, cols, tables
    finally:
        db.close()


def test_the_fixture_is_a_version_2_store():
    version, cols, tables = _schema(DATA / "store_v2")
    assert version == 2 and "chunk" not in cols and "item_text" not in tables


def test_old_collections_keep_what_they_had(v2_dir):
    with Engine(v2_dir) as eng:
        info = eng.describe(T, "docs")
        assert not info.chunking.enabled and info.count == info.chunks == 2
        got = {r.id: r for r in eng.get(T, "docs", ["d1", "d2", "d3"], include_vectors=True)}
        assert set(got) == {"d1", "d2"}  # d3 was deleted before the upgrade
        assert got["d2"].text == "okapis live in the forest"  # the replacement
        np.testing.assert_array_equal(got["d1"].vector, np.float32([1, 0, 0]))
        hits = eng.search(T, "docs", np.float32([1, 0, 0]), 2, include_text=True)[0].hits
        assert [h.id for h in hits] == ["d1", "d2"] and not hits[0].chunks
        assert hits[0].text.startswith("the otters")
        assert [h.id for h in eng.search_lexical(T, "docs", "otters", 5).hits] == ["d1"]
        assert eng.search_lexical(T, "docs", "zebras", 5).hits == []
        assert eng.describe(T, "plain").count == 1
        memories = eng.of_kind(Kind.MEMORY)
        assert len(memories.search_lexical(T, "agent", "friday", 5).hits) == 1
    version, cols, tables = _schema(v2_dir)
    assert version == SCHEMA_VERSION == 3 and {"chunk", "c_start", "c_end"} <= cols
    assert "item_text" in tables
    assert_lexical_matches_items(v2_dir)


def test_an_upgraded_store_takes_chunked_items_and_reopens_unchanged(v2_dir):
    text = "first part of the text. second part about walruses."
    with Engine(v2_dir) as eng:
        spans = [Span(0, 23, np.float32([0, 0, 1])), Span(24, len(text), np.float32([0, 1, 0]))]
        eng.upsert(T, "docs", [Record("long", None, text, {"n": 9}, chunks=spans)])
        info = eng.describe(T, "docs")
        assert info.count == 3 and info.chunks == 4
    before = _schema(v2_dir)
    with Engine(v2_dir) as eng:  # the live set and counts come back from the store
        info = eng.describe(T, "docs")
        assert info.count == 3 and info.chunks == 4
        assert eng.get(T, "docs", ["long"])[0].text == text
        hit = eng.search_lexical(T, "docs", "walruses", 3, include_text=True).hits[0]
        assert hit.id == "long" and [(c.index, c.start, c.end) for c in hit.chunks] == [
            (1, 24, len(text))
        ]
        assert hit.chunks[0].text == text[24:] and hit.text == text
        res = eng.search(T, "docs", np.float32([0, 0, 1]), 3)[0]
        assert [h.id for h in res.hits] == ["long", "d2", "d1"]  # each item once
        assert [c.index for c in res.hits[0].chunks] == [0] and not res.hits[2].chunks
    assert _schema(v2_dir) == before
    assert_lexical_matches_items(v2_dir)


def test_over_grpc_new_collections_chunk_and_old_ones_do_not(v2_dir):
    srv = InProcessServer(v2_dir)
    try:
        idx = srv.stubs.index
        idx.CreateCollection(index_pb2.CreateCollectionRequest(name="fresh"))
        fresh = idx.DescribeCollection(index_pb2.DescribeCollectionRequest(name="fresh"))
        old = idx.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"))
        assert fresh.chunking.enabled and fresh.chunking.max_tokens == 256
        assert not old.chunking.enabled and old.count == 2
    finally:
        srv.stop()
