"""A data directory written before collections had a lexical index opens upgraded in place:
every collection (and memory namespace) gets its FTS5 index of the live items, in one
transaction, and lexical and hybrid search work on the old items at once."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ragplane.index import Engine, Kind, lexical
from ragplane.index.store import DB_NAME, SCHEMA_VERSION
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import common_pb2, memory_pb2, search_pb2
from tests.lexical_consistency import assert_lexical_matches_items

DATA = Path(__file__).parent / "data"


@pytest.fixture
def v1_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(DATA / "store_v1", d)
    return d


def _schema(d: Path) -> tuple[int, set[str], set[str]]:
    db = sqlite3.connect(d / DB_NAME)
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        cols = {r[1] for r in db.execute("PRAGMA table_info(collections)")}
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return version, cols, {t for t in tables if t.startswith("lex_") and "_" not in t[4:]}
    finally:
        db.close()


def test_the_fixture_is_a_version_1_store():
    version, cols, lex = _schema(DATA / "store_v1")
    assert version == 1 and "lexical" not in cols and not lex


def test_upgrade_indexes_the_live_items_of_every_collection(v1_dir):
    with Engine(v1_dir) as eng:
        assert eng.describe("default", "docs").lexical_index

        def ids(text: str, coll: str = "docs") -> list[str]:
            return [h.id for h in eng.search_lexical("default", coll, text, 10).hits]

        assert ids("SSL_CTX_set_options") == ["d1"]
        assert ids("okapis") == ["d3"]  # the live version of d3
        assert ids("zebras") == [] and ids("giraffes") == []  # replaced, deleted
        assert ids("cafe naive") == ["d5"]
        assert ids("otters", "vecs") == ["v1"]
        memories = eng.of_kind(Kind.MEMORY)
        assert len(memories.search_lexical("default", "agent", "friday", 5).hits) == 1
        res = eng.search_hybrid("default", "vecs", "otters", np.float32([0, 1, 0]), 1)
        assert res.hits[0].id == "v1" and res.hits[0].lexical > 0
    version, cols, lex = _schema(v1_dir)
    assert version == SCHEMA_VERSION >= 2 and "lexical" in cols
    assert lex == {"lex_1", "lex_2", "lex_3"}
    assert assert_lexical_matches_items(v1_dir) == 7


def test_an_upgraded_store_opens_again_unchanged(v1_dir):
    Engine(v1_dir).close()
    before = _schema(v1_dir)
    with Engine(v1_dir) as eng:
        assert [h.id for h in eng.search_lexical("default", "docs", "okapis", 3).hits] == ["d3"]
    assert _schema(v1_dir) == before
    assert_lexical_matches_items(v1_dir)


def test_an_interrupted_upgrade_leaves_the_store_as_it_was(v1_dir, monkeypatch):
    calls = []

    def failing_backfill(c, coll_id):
        calls.append(coll_id)
        if len(calls) == 2:
            raise OSError("disk full")
        real(c, coll_id)

    real = lexical.backfill
    monkeypatch.setattr(lexical, "backfill", failing_backfill)
    with pytest.raises(OSError):
        Engine(v1_dir)
    version, cols, lex = _schema(v1_dir)
    assert version == 1 and "lexical" not in cols and not lex
    monkeypatch.setattr(lexical, "backfill", real)
    with Engine(v1_dir) as eng:
        assert [h.id for h in eng.search_lexical("default", "docs", "okapis", 3).hits] == ["d3"]
    assert_lexical_matches_items(v1_dir)


def test_a_version_0_store_upgrades_through_both_steps(tmp_path):
    d = tmp_path / "data"
    shutil.copytree(DATA / "store_v0", d)
    with Engine(d) as eng:
        assert eng.describe("default", "notes").lexical_index
    assert _schema(d)[0] == SCHEMA_VERSION
    assert assert_lexical_matches_items(d) > 0


def test_old_memories_are_recalled_by_words_over_grpc(v1_dir):
    srv = InProcessServer(v1_dir)
    try:
        s = srv.stubs
        r = s.memory.Recall(
            memory_pb2.RecallRequest(
                namespace="agent", query="friday deploy", mode=common_pb2.SEARCH_MODE_LEXICAL
            )
        )
        assert [m.text for m in r.memories] == ["the deploy window is friday at noon"]
        assert r.memories[0].parts.lexical > 0 and not r.memories[0].parts.HasField("dense")
        hits = s.search.Search(
            search_pb2.SearchRequest(
                collection="docs",
                text="os.path.join",
                top_k=2,
                mode=common_pb2.SEARCH_MODE_HYBRID,
            )
        ).hits
        assert hits[0].id == "d2" and hits[0].HasField("fused_score")
    finally:
        srv.stop()
