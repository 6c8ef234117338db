"""A data directory written before memory namespaces had a kind of their own still opens,
upgraded in place: collections stay collections, "memory:<tenant>" namespaces become the
tenant's memory namespaces, ids and checkpoints stay valid, and ids are never reused."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ragplane.index import Engine, IndexType, Kind, Metric, Record
from ragplane.index.store import DB_NAME, SCHEMA_VERSION
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import index_pb2, memory_pb2

V0 = Path(__file__).parent / "data" / "store_v0"
MEMORIES = [
    "the cat sleeps on the mat",
    "the train leaves at nine",
    "buy milk and bread",
    "call the dentist on monday",
]


@pytest.fixture
def v0_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(V0, d)
    return d


def _rows(d: Path) -> tuple[list[tuple], int, int]:
    db = sqlite3.connect(d / DB_NAME)
    try:
        rows = db.execute("SELECT id, tenant, kind, name FROM collections ORDER BY id").fetchall()
        (seq,) = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'collections'").fetchone()
        (version,) = db.execute("PRAGMA user_version").fetchone()
        return rows, seq, version
    finally:
        db.close()


def test_the_fixture_is_a_version_0_store():
    db = sqlite3.connect(V0 / DB_NAME)
    try:
        cols = {r[1] for r in db.execute("PRAGMA table_info(collections)")}
        tenants = sorted(t for (t,) in db.execute("SELECT tenant FROM collections"))
        assert "kind" not in cols and tenants == ["default", "memory:default"]
    finally:
        db.close()


def test_upgrade_gives_memory_namespaces_their_kind_and_keeps_ids(v0_dir):
    with Engine(v0_dir) as eng:
        notes = eng.describe("default", "notes")
        assert (notes.count, notes.dim) == (3, 4)
        assert [c.name for c in eng.list_all_collections()] == ["notes"]
        memories = eng.of_kind(Kind.MEMORY)
        assert [(c.tenant, c.name, c.count) for c in memories.list_all_collections()] == [
            ("default", "notes", 4)
        ]
        got = eng.get("default", "notes", ["doc-2"], include_vectors=True)
        v = np.float32([3.0, 1.0, 0.0, 0.5])  # as written; cosine collections store it unit
        np.testing.assert_allclose(got[0].vector, v / np.linalg.norm(v), rtol=1e-6)
        hits = eng.search("default", "notes", np.float32([3.0, 1.0, 0.0, 0.5]), 1)[0].hits
        assert hits[0].id == "doc-2"
        # a name may now be both a collection and a memory namespace of one tenant
        memories.create_collection(
            "default", "docs", dim=4, metric=Metric.COSINE, index_type=IndexType.FLAT, embedder=""
        )
        eng.create_collection(
            "default", "docs", dim=4, metric=Metric.COSINE, index_type=IndexType.FLAT, embedder=""
        )
        eng.upsert("default", "docs", [Record("a", np.ones(4, np.float32))])
        assert memories.describe("default", "docs").count == 0
    rows, seq, version = _rows(v0_dir)
    assert version == SCHEMA_VERSION
    # ids kept; the dropped collection's id (3) is never handed out again
    assert rows[:2] == [(1, "default", "collection", "notes"), (2, "default", "memory", "notes")]
    assert sorted(r[0] for r in rows[2:]) == [4, 5] and seq == 5


def test_an_upgraded_store_opens_again_unchanged(v0_dir):
    Engine(v0_dir).close()
    before = _rows(v0_dir)
    with Engine(v0_dir) as eng:
        assert eng.describe("default", "notes").count == 3
    assert _rows(v0_dir) == before


def test_old_memories_are_listed_in_pages_and_recalled(v0_dir):
    srv = InProcessServer(v0_dir)
    try:
        s = srv.stubs
        page = memory_pb2.ListMemoriesRequest(namespace="notes", page_size=3)
        first = s.memory.ListMemories(page)
        assert [m.text for m in first.memories] == MEMORIES[:3] and first.next_page_token
        rest = s.memory.ListMemories(
            memory_pb2.ListMemoriesRequest(
                namespace="notes", page_size=3, page_token=first.next_page_token
            )
        )
        assert [m.text for m in rest.memories] == MEMORIES[3:] and not rest.next_page_token
        recalled = s.memory.Recall(memory_pb2.RecallRequest(namespace="notes", query=MEMORIES[1]))
        assert recalled.memories[0].text == MEMORIES[1]
        listed = s.index.ListCollections(index_pb2.ListCollectionsRequest()).collections
        assert [c.name for c in listed] == ["notes"] and listed[0].count == 3
    finally:
        srv.stop()
