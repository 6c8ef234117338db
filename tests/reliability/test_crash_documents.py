"""Crash safety of long documents: the server is SIGKILLed at random moments of a long
document's upsert (while it is chunked, embedded, or written). After each restart every
document is all of its chunks or none: Describe's chunk count is the sum of the present
documents' chunk counts (known from the same text upserted, acknowledged, into another
collection), Get returns the whole text, the document's last words find it in lexical and
dense search (or find nothing when it is absent), an acknowledged upsert is always
there, and the lexical index holds exactly the live chunks. Seeded; KILLS rounds."""

from __future__ import annotations

import os
import random
import threading
import time

import grpc
import pytest

from ragplane.testkit.harness import SubprocessServer
from ragplane.testkit.texts import corpus
from ragplane.v1 import common_pb2, index_pb2, search_pb2
from tests.lexical_consistency import assert_lexical_matches_items

pytestmark = pytest.mark.e2e

KILLS = int(os.environ.get("RAGPLANE_CRASH_KILLS", "6"))  # `make crash` runs 100
SEED = 20261202


def _document(i: int) -> str:
    paras = corpus(400)[(i * 37) % 300 :][:60]
    return "\n\n".join(paras) + f"\n\nThe end of document marker{i} café."


def _upsert(stubs, coll: str, i: int, text: str):
    return stubs.index.Upsert(
        index_pb2.UpsertRequest(
            collection=coll, items=[common_pb2.Item(id=f"doc{i}", text=text)]
        ),
        timeout=120,
    )


def _lexical(stubs, word: str) -> list[str]:
    req = search_pb2.SearchRequest(collection="docs", text=word, top_k=10,
                                   mode=common_pb2.SEARCH_MODE_LEXICAL)
    return [h.id for h in stubs.search.Search(req).hits]


def test_a_killed_upsert_leaves_all_of_a_document_or_none(tmp_path):
    rng = random.Random(SEED)
    srv = SubprocessServer(tmp_path / "data")
    srv.start()
    try:
        for name in ("docs", "ref"):
            srv.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name=name))
        texts, chunks, took = {}, {}, 0.0
        for i in range(KILLS):
            texts[i] = _document(i)
            t0 = time.monotonic()
            chunks[i] = _upsert(srv.stubs, "ref", i, texts[i]).chunks
            took = max(took, time.monotonic() - t0)
            assert chunks[i] > 5
        acked: set[int] = set()
        for i in range(KILLS):
            done = threading.Event()

            def write(i=i, done=done):
                try:
                    _upsert(srv.stubs, "docs", i, texts[i])
                    acked.add(i)
                except grpc.RpcError:
                    pass  # killed in flight: may or may not have landed
                done.set()

            threading.Thread(target=write, daemon=True).start()
            time.sleep(rng.uniform(0.0, took * 1.2))
            srv.kill()
            done.wait(30)
            assert_lexical_matches_items(srv.data_dir)
            srv.start()
            _check(srv.stubs, texts, chunks, acked, upto=i)
    finally:
        srv.stop()


def _check(stubs, texts, chunks, acked, upto: int) -> None:
    ids = [f"doc{j}" for j in range(upto + 1)]
    got = {it.id: it.text for it in stubs.index.Get(
        index_pb2.GetRequest(collection="docs", ids=ids)).items}
    present = {int(k[3:]) for k in got}
    assert acked <= present, f"acknowledged but lost: {sorted(acked - present)}"
    info = stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"))
    assert info.count == len(present)
    assert info.chunks == sum(chunks[j] for j in present), "a document is partly there"
    for j in range(upto + 1):
        if j in present:
            assert got[f"doc{j}"] == texts[j]
            assert _lexical(stubs, f"marker{j}") == [f"doc{j}"]
        else:
            assert _lexical(stubs, f"marker{j}") == []
