"""Crash safety of the lexical index: upserts (new ids and new versions of old ones) and
deletes run through gRPC while the server is SIGKILLed at random moments. After every
restart the lexical index must hold exactly the live items, with their current text:

- a fresh FTS5 index of the live items (tests/lexical_consistency.py) has the same postings,
- LEXICAL search for the word every text has returns exactly the ids Get finds (while they
  fit in one search's MAX_TOP_K hits; past that, MAX_TOP_K of them),
- each present item is found by its current text's own word, and no word of a replaced or
  deleted version finds anything,
- every acknowledged write is there (and every acknowledged delete gone).

Seeded; KILLS cycles of a second or so each.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import grpc
import pytest

from ragplane.index.validate import MAX_TOP_K
from ragplane.testkit.harness import Stubs, SubprocessServer
from ragplane.v1 import common_pb2, index_pb2, search_pb2
from tests.lexical_consistency import assert_lexical_matches_items

pytestmark = pytest.mark.e2e

KILLS = int(os.environ.get("RAGPLANE_CRASH_KILLS", "8"))  # `make crash` runs 100
DIM = 4
SEED = 20261201
COLL = "crashlex"


@dataclass
class Ledger:
    acked: dict[str, str] = field(default_factory=dict)  # id -> text acknowledged
    deleted: set[str] = field(default_factory=set)  # ids whose delete was acknowledged
    maybe: dict[str, set[str | None]] = field(default_factory=dict)  # in flight (None: delete)
    stale: set[str] = field(default_factory=set)  # words of texts no longer current
    lock: threading.Lock = field(default_factory=threading.Lock)
    writes: int = 0


def _word(n: int, wid: int) -> str:
    return f"w{wid}q{n}z"  # one per write, shared by no other text


def _writer(
    port: int, wid: int, rng: random.Random, led: Ledger, stop: threading.Event, cycle: int
):
    stubs = Stubs.dial(f"127.0.0.1:{port}")
    n = cycle * 1_000_000  # words and new ids never repeat across cycles
    try:
        while not stop.is_set():
            with led.lock:
                known = sorted(i for i in led.acked if i.startswith(f"w{wid}-"))
            if known and rng.random() < 0.15:
                gone = rng.choice(known)
                with led.lock:
                    led.maybe.setdefault(gone, set()).add(None)
                req = index_pb2.DeleteRequest(collection=COLL, ids=common_pb2.IdList(ids=[gone]))
                call, batch = (lambda req=req: stubs.index.Delete(req, timeout=10)), [(gone, None)]
            else:
                batch = []
                for _ in range(rng.randint(1, 5)):
                    reuse = known and rng.random() < 0.3
                    item_id = rng.choice(known) if reuse else f"w{wid}-{n}"
                    if all(b[0] != item_id for b in batch):
                        batch.append((item_id, f"every item {_word(n, wid)}"))
                    n += 1
                with led.lock:
                    for item_id, text in batch:
                        led.maybe.setdefault(item_id, set()).add(text)
                items = [
                    common_pb2.Item(id=i, text=t, vector=[rng.uniform(-1, 1) for _ in range(DIM)])
                    for i, t in batch
                ]
                req = index_pb2.UpsertRequest(collection=COLL, items=items)
                call = lambda req=req: stubs.index.Upsert(req, timeout=10)  # noqa: E731
            try:
                call()
            except grpc.RpcError:
                return  # the server died; the write stays in `maybe`
            with led.lock:
                for item_id, text in batch:
                    _settle(led, item_id, text)
                led.writes += 1
    finally:
        stubs.close()


def _settle(led: Ledger, item_id: str, text: str | None) -> None:
    """Record `item_id`'s current state (its text, or deleted when None)."""
    old = led.acked.pop(item_id, None)
    if old is not None and old != text:
        led.stale.add(old.split()[-1])
    if text is None:
        led.deleted.add(item_id)
    else:
        led.deleted.discard(item_id)
        led.acked[item_id] = text
    led.maybe.pop(item_id, None)


def _lexical(stubs: Stubs, text: str) -> list[str]:
    req = search_pb2.SearchRequest(
        collection=COLL, text=text, top_k=10_000, mode=common_pb2.SEARCH_MODE_LEXICAL
    )
    r = stubs.search.Search(req)
    assert r.exhaustive and r.returned_k == len(r.hits)
    return [h.id for h in r.hits]


def _verify(srv: SubprocessServer, led: Ledger) -> int:
    stubs = srv.stubs
    candidates = sorted(set(led.acked) | set(led.maybe) | led.deleted)
    got = {
        it.id: it.text
        for it in stubs.index.Get(index_pb2.GetRequest(collection=COLL, ids=candidates)).items
    }
    for item_id in candidates:
        allowed = set(led.maybe.get(item_id, ()))
        allowed.add(led.acked.get(item_id))  # None: absent (deleted, or never acknowledged)
        have = got.get(item_id)
        assert have in allowed, f"{item_id}: {have!r} is neither acknowledged nor in flight"
        if item_id in led.maybe:  # in flight at the kill: whichever state landed counts now
            _settle(led, item_id, have)
    led.maybe.clear()
    # A search returns MAX_TOP_K hits at most, and 100 kills grow the collection past that:
    # beyond it, the hits must still be live ids, as many as the cap; the per-word queries
    # below find each present item by its own word either way.
    every = _lexical(stubs, "every")
    if len(got) <= MAX_TOP_K:
        assert sorted(every) == sorted(got), "lexical index and items differ"
    else:
        assert len(every) == MAX_TOP_K and set(every) <= set(got), "lexical search past the cap"
    present = sorted(got)
    for lo in range(0, len(present), 32):  # 64 words per query at most: 32 live, 32 stale
        chunk = present[lo : lo + 32]
        words = [got[i].split()[-1] for i in chunk]
        stale = sorted(led.stale)[lo % max(1, len(led.stale)) :][:32]
        assert sorted(_lexical(stubs, " ".join(words + stale))) == sorted(chunk)
    return len(got)


def test_sigkill_never_leaves_the_lexical_index_and_items_apart(tmp_path, capsys):
    rng = random.Random(SEED)
    led = Ledger()
    srv = SubprocessServer(tmp_path / "data", "--set", "checkpoint_every=32")
    srv.start()
    srv.stubs.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name=COLL, dim=DIM, metric=index_pb2.METRIC_IP)
    )
    t0, checked = time.monotonic(), 0
    try:
        for cycle in range(KILLS):
            stop = threading.Event()
            writers = [
                threading.Thread(
                    target=_writer,
                    args=(srv.port, w, random.Random(rng.random()), led, stop, cycle),
                )
                for w in range(2)
            ]
            for t in writers:
                t.start()
            time.sleep(rng.uniform(0.2, 1.0))
            srv.kill()
            stop.set()
            for t in writers:
                t.join(30)
            checked += assert_lexical_matches_items(srv.data_dir)  # as the kill left it
            srv.start()
            checked += _verify(srv, led)
    finally:
        srv.kill()  # also when a check fails: no server outlives the test
    with capsys.disabled():
        print(
            f"\ncrash (lexical): {KILLS} SIGKILLs, {led.writes} acknowledged writes, "
            f"{len(led.acked)} items at the end, {len(led.stale)} stale words, "
            f"{checked} item checks, {time.monotonic() - t0:.1f}s"
        )
    assert led.writes > KILLS * 5 and len(led.stale) > 10 and led.deleted
    assert len(led.acked) > 50
