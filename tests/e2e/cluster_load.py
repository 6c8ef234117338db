"""A sustained write load on a cluster's servers for tests/e2e/test_cluster.py (issue 38):
on each server, threads upsert ids every server writes (conflicts, duplicate keys), ids of
their own, create collections and remember; every call's status and time is recorded,
and what was acknowledged is kept to be read back afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from ragplane.testkit.harness import Stubs, SubprocessServer
from ragplane.testkit.postgres import until
from ragplane.v1 import common_pb2, index_pb2, memory_pb2

DIM = 16
SHARED_IDS = 40  # ids that every server writes: the same rows, from different servers
BATCH = 10



@contextlib.contextmanager
def servers_on(url: str, folder: Path, n: int) -> Iterator[list[SubprocessServer]]:
    """`n` servers sharing the PostgreSQL store at `url`, started, and stopped after."""
    servers = [SubprocessServer(folder / f"s{i}", "--set", f"store={url}") for i in range(n)]
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


@dataclass(frozen=True)
class Call:
    server: str
    method: str
    code: grpc.StatusCode
    seconds: float
    retry_after: float | None
    at: float  # monotonic, when it ended
    details: str = ""


@dataclass
class Acked:
    items: set[str] = field(default_factory=set)
    collections: set[str] = field(default_factory=set)
    memories: set[str] = field(default_factory=set)
    position: int = 0  # the highest consistency token's position
    token: str = ""  # that token


def _items(ids: list[str], rng: np.random.Generator) -> list[common_pb2.Item]:
    mat = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    return [common_pb2.Item(id=i, text=f"item {i}", vector=row)
            for i, row in zip(ids, mat.tolist(), strict=True)]


class Load:
    """`start()` two writer threads per server; `stop(name)` ends one server's, `stop()`
    all. Calls go to `collection` (dim 16) and the memory namespace `memories`."""

    def __init__(self, servers: dict[str, Stubs], collection: str = "c") -> None:
        self.servers = servers
        self.collection = collection
        self.calls: list[Call] = []
        self.acked = Acked()
        self._lock = threading.Lock()
        self._stops = {name: threading.Event() for name in servers}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for name in self.servers:
            for job in (self._upserts, self._mixed):
                t = threading.Thread(target=job, args=(name,), daemon=True)
                t.start()
                self._threads.append(t)

    def stop(self, name: str | None = None) -> None:
        for n in [name] if name else list(self._stops):
            self._stops[n].set()
        if name is None:
            for t in self._threads:
                t.join(timeout=30)

    def codes(self, since: float = 0.0) -> Counter:
        with self._lock:
            return Counter((c.method, c.code.name) for c in self.calls if c.at >= since)

    def _call(self, name: str, method: str, fn, request):
        t0 = time.monotonic()
        code, retry, details, reply = grpc.StatusCode.OK, None, "", None
        try:
            reply = fn(request, timeout=10)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            trailers = dict(exc.trailing_metadata() or ())
            retry = float(trailers["retry-after"]) if "retry-after" in trailers else None
        except ValueError:  # the channel was closed: this server was killed
            return None
        t1 = time.monotonic()
        if retry is not None:  # a client waits as told, here at most 0.1 s
            self._stops[name].wait(min(retry, 0.1))
        with self._lock:
            self.calls.append(Call(name, method, code, t1 - t0, retry, t1, details))
            if reply is not None and getattr(reply, "consistency_token", ""):
                pos = int(reply.consistency_token.rsplit(".", 1)[1])
                if pos > self.acked.position:
                    self.acked.position, self.acked.token = pos, reply.consistency_token
        return reply

    def _upserts(self, name: str) -> None:
        """Batches alternating between the shared ids and ids of this server's own."""
        stubs, stop = self.servers[name], self._stops[name]
        rng = np.random.default_rng(abs(hash(name)) % 2**32)
        n = 0
        while not stop.is_set():
            if n % 2 == 0:
                start = int(rng.integers(0, SHARED_IDS - BATCH))
                ids = [f"s{k}" for k in range(start, start + BATCH)]
            else:
                ids = [f"{name}-{n}-{k}" for k in range(BATCH)]
            req = index_pb2.UpsertRequest(collection=self.collection, items=_items(ids, rng))
            if self._call(name, "Upsert", stubs.index.Upsert, req) is not None:
                with self._lock:
                    self.acked.items.update(ids)
            n += 1

    def _mixed(self, name: str) -> None:
        """CreateCollection, Remember and an upsert of shared ids, in turn."""
        stubs, stop = self.servers[name], self._stops[name]
        rng = np.random.default_rng(abs(hash(name + "m")) % 2**32)
        n = 0
        while not stop.is_set():
            if n % 3 == 0:
                coll = f"x-{name}-{n}"
                req = index_pb2.CreateCollectionRequest(name=coll, dim=DIM)
                reply = self._call(name, "CreateCollection", stubs.index.CreateCollection, req)
                if reply is not None:
                    with self._lock:
                        self.acked.collections.add(coll)
            elif n % 3 == 1:
                text = f"{name} remembers {uuid.uuid4().hex} " + uuid.uuid4().hex
                req = memory_pb2.RememberRequest(namespace="memories", text=text)
                reply = self._call(name, "Remember", stubs.memory.Remember, req)
                if reply is not None:
                    with self._lock:
                        self.acked.memories.add(reply.id)
            else:
                ids = [f"s{k}" for k in rng.choice(SHARED_IDS, BATCH, replace=False)]
                req = index_pb2.UpsertRequest(collection=self.collection, items=_items(ids, rng))
                if self._call(name, "Upsert", stubs.index.Upsert, req) is not None:
                    with self._lock:
                        self.acked.items.update(ids)
            n += 1


def crash(pg) -> None:
    """PostgreSQL stopped as by `pg_ctl stop -m immediate` (SIGQUIT to the postmaster):
    no checkpoint, every connection cut; the next start recovers from the WAL."""
    pid = int((pg.data / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGQUIT)

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    until(gone, timeout=30)


def read_back(stubs: Stubs, load: Load) -> None:
    """Every write the load saw acknowledged, read through `stubs` at the newest token."""
    token = load.acked.token
    want = sorted(load.acked.items)
    got: set[str] = set()
    for lo in range(0, len(want), 500):
        req = index_pb2.GetRequest(collection="c", ids=want[lo : lo + 500], consistency_token=token)
        got.update(i.id for i in stubs.index.Get(req, timeout=30).items)
    assert got == set(want), f"{len(set(want) - got)} acknowledged items missing"
    req = index_pb2.ListCollectionsRequest(consistency_token=token)
    names = {i.name for i in stubs.index.ListCollections(req, timeout=30).collections}
    assert load.acked.collections <= names, sorted(load.acked.collections - names)[:5]
    memories: set[str] = set()
    page = ""
    while True:
        req = memory_pb2.ListMemoriesRequest(
            namespace="memories", page_size=500, page_token=page, consistency_token=token
        )
        reply = stubs.memory.ListMemories(req, timeout=30)
        memories.update(m.id for m in reply.memories)
        if not (page := reply.next_page_token):
            break
    assert load.acked.memories <= memories, sorted(load.acked.memories - memories)[:5]
