"""Crash safety: writers run through gRPC while the server is SIGKILLed at random moments.

Two upsert writers (vectors, metadata, some replacements of earlier ids) and one Remember
writer record what the server acknowledged. After every kill the server restarts over the
same data and every acknowledged write must be there: no id lost, none invented (anything
present was at least sent), none twice, vectors bit-identical, DescribeCollection's count
equal to the ids present, and a filtered search returning exactly the ids whose metadata
match. A write in flight at the kill may or may not have landed; whichever it is, it must
be whole. Seeded, and bounded in time (KILLS cycles of a second or two each).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.testkit.harness import Stubs, SubprocessServer
from ragplane.v1 import common_pb2, index_pb2, memory_pb2, search_pb2

pytestmark = pytest.mark.e2e

KILLS = int(os.environ.get("RAGPLANE_CRASH_KILLS", "20"))  # `make crash` runs 100
DIM = 8
SEED = 20261129
COLL = "crash"
NS = "crash-mem"


@dataclass
class Ledger:
    """What the writers sent and what the server acknowledged, per id."""

    acked: dict[str, bytes] = field(default_factory=dict)  # id -> float32 bytes acknowledged
    maybe: dict[str, dict[bytes, int]] = field(default_factory=dict)  # in flight: vec -> parity
    parity: dict[str, int] = field(default_factory=dict)  # id -> parity acknowledged
    mem_acked: dict[str, str] = field(default_factory=dict)  # memory id -> text
    mem_sent: set[str] = field(default_factory=set)  # every text ever sent
    lock: threading.Lock = field(default_factory=threading.Lock)
    writes: int = 0


def _upserter(port: int, wid: int, rng: random.Random, led: Ledger, stop: threading.Event):
    stubs = Stubs.dial(f"127.0.0.1:{port}")
    n = 0
    try:
        while not stop.is_set():
            batch = []
            for _ in range(rng.randint(1, 6)):
                with led.lock:
                    known = [i for i in led.acked if i.startswith(f"w{wid}-")]
                if known and rng.random() < 0.2:
                    item_id = rng.choice(known)  # replace an acknowledged item
                else:
                    item_id, n = f"w{wid}-{n}", n + 1
                if any(b[0] == item_id for b in batch):
                    continue
                vec = np.asarray([rng.uniform(-1, 1) for _ in range(DIM)], dtype=np.float32)
                batch.append((item_id, vec, n % 2))
            with led.lock:
                for item_id, vec, p in batch:
                    led.maybe.setdefault(item_id, {})[vec.tobytes()] = p
            req = index_pb2.UpsertRequest(
                collection=COLL,
                items=[
                    common_pb2.Item(
                        id=i, vector=v.tolist(), metadata=dict_to_struct({"parity": p, "w": wid})
                    )
                    for i, v, p in batch
                ],
            )
            try:
                stubs.index.Upsert(req, timeout=10)
            except grpc.RpcError:
                return  # the server died; what was in flight stays in `maybe`
            with led.lock:
                for item_id, vec, p in batch:
                    led.acked[item_id] = vec.tobytes()
                    led.parity[item_id] = p
                    led.maybe[item_id].pop(vec.tobytes(), None)
                led.writes += 1
    finally:
        stubs.close()


def _rememberer(port: int, rng: random.Random, led: Ledger, stop: threading.Event, cycle: int):
    stubs = Stubs.dial(f"127.0.0.1:{port}")
    n = 0
    try:
        while not stop.is_set():
            # words no other memory shares, so dedup never merges two of them
            text = f"c{cycle}n{n}a c{cycle}n{n}b c{cycle}n{n}c {rng.random():.12f}"
            n += 1
            with led.lock:
                led.mem_sent.add(text)
            try:
                r = stubs.memory.Remember(
                    memory_pb2.RememberRequest(namespace=NS, text=text), timeout=10
                )
            except grpc.RpcError:
                return
            assert not r.deduplicated, text
            with led.lock:
                led.mem_acked[r.id] = text
                led.writes += 1
    finally:
        stubs.close()


def _verify(stubs: Stubs, led: Ledger) -> int:
    """Check the restarted server against the ledger; settle in-flight writes. Returns the
    number of acknowledged writes (ids and memories) checked."""
    info = stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name=COLL))
    candidates = sorted(set(led.acked) | set(led.maybe))
    got: dict[str, common_pb2.Item] = {}
    for i in range(0, len(candidates), 1000):
        r = stubs.index.Get(
            index_pb2.GetRequest(
                collection=COLL, ids=candidates[i : i + 1000], include_vectors=True
            )
        )
        for it in r.items:
            assert it.id not in got, f"id {it.id} returned twice"
            got[it.id] = it
    for item_id in led.acked:
        assert item_id in got, f"acknowledged id {item_id} lost"
    for item_id, it in got.items():
        have = np.asarray(it.vector, dtype=np.float32).tobytes()
        allowed = dict(led.maybe.get(item_id, {}))
        if item_id in led.acked:
            allowed[led.acked[item_id]] = led.parity[item_id]
        assert have in allowed, f"id {item_id}: vector is neither acknowledged nor sent"
        assert int(it.metadata["parity"]) == allowed[have], f"id {item_id}: metadata torn"
        # an in-flight write that landed counts as acknowledged from now on
        led.acked[item_id], led.parity[item_id] = have, allowed[have]
    led.maybe.clear()
    assert info.count == len(got), f"count {info.count} != {len(got)} ids present"
    # the whole collection holds nothing else (no phantom ids)
    q = search_pb2.SearchRequest(
        collection=COLL, vector=common_pb2.Vector(values=[1.0] * DIM), top_k=10_000
    )
    every = {h.id for h in stubs.search.Search(q).hits}
    assert every == set(got), f"phantoms: {sorted(every - set(got))[:5]}"
    cond = common_pb2.Condition(field="parity", op=common_pb2.FILTER_OP_EQ, value=py_to_value(0))
    q.filter.must.append(cond)
    r = stubs.search.Search(q)
    even = {i for i, p in led.parity.items() if p == 0 and i in got}
    assert {h.id for h in r.hits} == even and r.returned_k == len(even)

    memories: dict[str, str] = {}
    token = ""
    while True:
        page = stubs.memory.ListMemories(
            memory_pb2.ListMemoriesRequest(namespace=NS, page_size=500, page_token=token)
        )
        for m in page.memories:
            assert m.id not in memories, f"memory {m.id} listed twice"
            assert m.text in led.mem_sent, f"phantom memory {m.id}: {m.text!r}"
            memories[m.id] = m.text
        token = page.next_page_token
        if not token:
            break
    for mid, text in led.mem_acked.items():
        assert memories.get(mid) == text, f"acknowledged memory {mid} lost or changed"
    texts = list(memories.values())
    assert len(texts) == len(set(texts)), "one remembered text stored twice"
    led.mem_acked.update(memories)
    return len(led.acked) + len(led.mem_acked)


def test_sigkill_during_writes_loses_nothing_acknowledged(tmp_path, capsys):
    rng = random.Random(SEED)
    led = Ledger()
    # checkpoints every 64 writes, so kills land before, during and after checkpoints
    srv = SubprocessServer(tmp_path / "data", "--set", "checkpoint_every=64")
    srv.start()
    srv.stubs.index.CreateCollection(
        index_pb2.CreateCollectionRequest(name=COLL, dim=DIM, metric=index_pb2.METRIC_IP)
    )
    r = srv.stubs.memory.Remember(memory_pb2.RememberRequest(namespace=NS, text="seed memory"))
    led.mem_sent.add("seed memory")
    led.mem_acked[r.id] = "seed memory"
    t0 = time.monotonic()
    checked = 0
    for cycle in range(KILLS):
        stop = threading.Event()
        writers = [
            threading.Thread(
                target=_upserter, args=(srv.port, w, random.Random(rng.random()), led, stop)
            )
            for w in range(2)
        ] + [
            threading.Thread(
                target=_rememberer, args=(srv.port, random.Random(rng.random()), led, stop, cycle)
            )
        ]
        for t in writers:
            t.start()
        time.sleep(rng.uniform(0.15, 1.0))
        srv.kill()
        stop.set()
        for t in writers:
            t.join(30)
        srv.start()
        checked += _verify(srv.stubs, led)
    final = _verify(srv.stubs, led)
    srv.kill()  # graceful shutdown has its own test (test_shutdown.py)
    with capsys.disabled():
        print(
            f"\ncrash: {KILLS} SIGKILLs, {led.writes} acknowledged write calls, "
            f"{final} ids+memories at the end, {checked} acknowledged writes checked in all, "
            f"{time.monotonic() - t0:.1f}s"
        )
    assert led.writes > KILLS * 5 and len(led.acked) > 100
