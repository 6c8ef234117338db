"""What the scenarios share in one run: real text, a seeded collection to search, a
collection to ingest into, and cleanup.

Setup and cleanup use their own channel without the Locust interceptor, so seeding is not
counted as load. Names carry a per-run id (`loadtest-<UTC time>-<random>`), so runs never
collide with each other or with real data, and everything created is deleted at the end.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf.struct_pb2 import Struct

from loadtest.grpc_user import CHANNEL_OPTIONS, auth_metadata
from ragplane.testkit.texts import corpus
from ragplane.v1 import (
    common_pb2,
    embed_pb2,
    embed_pb2_grpc,
    index_pb2,
    index_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
)

log = logging.getLogger("loadtest")

SEED_ITEMS_ENV = "RAGPLANE_LOADTEST_SEED_ITEMS"
DEFAULT_SEED_ITEMS = 1000
CORPUS_SIZE = 4000  # distinct passages; seeds come first, the rest feed ingest and memory
QUERY_WORDS = 12  # queries are the opening words of a passage: short, like real questions
SETUP_TIMEOUT_S = 300.0  # a real model embeds the seed items on CPU
CONNECT_TIMEOUT_S = 15.0


def item_metadata(i: int, text: str) -> dict[str, object]:
    """Metadata the search scenarios filter on: a bucket (0..9), a length and a kind."""
    return {"bucket": i % 10, "words": len(text.split()), "kind": "even" if i % 2 == 0 else "odd"}


def to_struct(d: dict[str, object]) -> Struct:
    s = Struct()
    s.update(d)
    return s


@dataclass
class RunState:
    """One run's names and data, shared by every simulated user."""

    host: str
    run_id: str
    texts: list[str]
    seed_items: int
    query_vectors: list[list[float]]
    embedder: str
    namespaces: set[str] = field(default_factory=set)
    _users: itertools.count = field(default_factory=itertools.count)

    @property
    def search_collection(self) -> str:
        return f"{self.run_id}-search"

    @property
    def ingest_collection(self) -> str:
        return f"{self.run_id}-ingest"

    def queries(self) -> list[str]:
        return [" ".join(t.split()[:QUERY_WORDS]) for t in self.texts[-500:]]

    def next_user(self) -> int:
        return next(self._users)


_state: RunState | None = None


def state() -> RunState:
    if _state is None:
        raise RuntimeError("the load test was not prepared; loadtest.fixtures.prepare(host) first")
    return _state


def seed_items_default() -> int:
    return int(os.environ.get(SEED_ITEMS_ENV, DEFAULT_SEED_ITEMS))


def prepare(host: str, seed_items: int | None = None) -> RunState:
    """Create and seed this run's collections on `host`; returns (and keeps) the run state.

    Raises grpc.RpcError if the server refuses (e.g. UNAUTHENTICATED without
    $RAGPLANE_API_KEY on a server that has keys).
    """
    global _state
    seed_items = seed_items_default() if seed_items is None else seed_items
    texts = corpus(CORPUS_SIZE)
    if not 0 < seed_items <= CORPUS_SIZE // 2:
        raise ValueError(f"seed items must be in 1..{CORPUS_SIZE // 2}, got {seed_items}")
    run_id = f"loadtest-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    md = auth_metadata()
    t0 = time.perf_counter()
    with grpc.insecure_channel(host.removeprefix("grpc://"), options=CHANNEL_OPTIONS) as ch:
        grpc.channel_ready_future(ch).result(timeout=CONNECT_TIMEOUT_S)
        embed = embed_pb2_grpc.EmbedServiceStub(ch)
        index = index_pb2_grpc.IndexServiceStub(ch)
        info = embed.Info(embed_pb2.InfoRequest(), metadata=md, timeout=30)
        st = RunState(host, run_id, texts, seed_items, [], f"{info.embedder} ({info.model})")
        _state = st  # from here on, cleanup() removes whatever was created
        try:
            _seed(st, embed, index, md)
        except BaseException:
            cleanup()
            raise
    log.info(
        "prepared %s: %d seed items in %.1fs (%s)",
        run_id,
        seed_items,
        time.perf_counter() - t0,
        st.embedder,
    )
    return st


def _seed(
    st: RunState,
    embed: embed_pb2_grpc.EmbedServiceStub,
    index: index_pb2_grpc.IndexServiceStub,
    md: tuple[tuple[str, str], ...],
) -> None:
    for name in (st.search_collection, st.ingest_collection):
        index.CreateCollection(
            index_pb2.CreateCollectionRequest(name=name), metadata=md, timeout=30
        )
    batch = 64
    for lo in range(0, st.seed_items, batch):
        items = [
            common_pb2.Item(
                id=f"seed-{i}", text=st.texts[i], metadata=to_struct(item_metadata(i, st.texts[i]))
            )
            for i in range(lo, min(lo + batch, st.seed_items))
        ]
        index.Upsert(
            index_pb2.UpsertRequest(collection=st.search_collection, items=items),
            metadata=md,
            timeout=SETUP_TIMEOUT_S,
        )
    r = embed.Embed(
        embed_pb2.EmbedRequest(texts=st.queries()[:32]), metadata=md, timeout=SETUP_TIMEOUT_S
    )
    st.query_vectors = [list(v.values) for v in r.vectors]


def cleanup() -> None:
    """Delete this run's collections and memory namespaces; best effort, never raises."""
    global _state
    st, _state = _state, None
    if st is None:
        return
    md = auth_metadata()
    index_calls = [
        ("DeleteCollection", index_pb2.DeleteCollectionRequest(name=name))
        for name in (st.search_collection, st.ingest_collection)
    ]
    memory_calls = [
        ("Forget", memory_pb2.ForgetRequest(namespace=ns, all=True)) for ns in sorted(st.namespaces)
    ]
    with grpc.insecure_channel(st.host.removeprefix("grpc://"), options=CHANNEL_OPTIONS) as ch:
        index = index_pb2_grpc.IndexServiceStub(ch)
        memory = memory_pb2_grpc.MemoryServiceStub(ch)
        for stub, calls in ((index, index_calls), (memory, memory_calls)):
            for method, request in calls:
                try:
                    getattr(stub, method)(request, metadata=md, timeout=60)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:  # already gone is fine
                        log.warning("cleanup of %s: %s: %s", st.run_id, method, exc.details())
