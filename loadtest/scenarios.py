"""The load scenarios: one Locust user class per traffic shape.

Every task is one RPC (two for nothing), so Locust's per-RPC statistics read directly as
"what this traffic costs". Users run closed-loop (no think time): `--users N` is the number
of calls in flight, which is what a server's concurrency limits see.

| user        | RPCs                                                              |
| ----------- | ----------------------------------------------------------------- |
| EmbedHeavy  | EmbedService/Embed (1, 8 and 32 texts), EmbedStream, Info         |
| SearchHeavy | SearchService/Search (text, text + filter, vector) on seeded data |
| Ingest      | IndexService/Upsert (16 new items), Get, Delete                   |
| Memory      | MemoryService/Remember, Recall, ListMemories, Forget              |
| Mixed       | all of the above, weighted like a RAG application                 |
"""

from __future__ import annotations

import collections
import functools
import random
from collections.abc import Callable
from typing import TypeVar

import grpc
from locust import constant

from loadtest import fixtures
from loadtest.grpc_user import GrpcUser
from ragplane.v1 import (
    common_pb2,
    embed_pb2,
    index_pb2,
    memory_pb2,
    search_pb2,
)

TOP_K = 10
UPSERT_BATCH = 16
ANCHOR_MEMORIES = 3  # remembered once per user and never forgotten: recall always has data

U = TypeVar("U", bound="RagplaneUser")


def rpc_task(fn: Callable[[U], None]) -> Callable[[U], None]:
    """A task whose failed calls are already in Locust's statistics (the interceptor reported
    them), so a non-OK status ends the task quietly instead of also logging a traceback as a
    user error. Anything else raised is a bug in the load test and still surfaces."""

    @functools.wraps(fn)
    def run(user: U) -> None:
        try:
            fn(user)
        except grpc.RpcError:
            pass

    return run


class RagplaneUser(GrpcUser):
    """Per-user state on top of the run's shared fixtures: a random stream, own ids and
    memory namespace, and the texts to send."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        self.fx = fixtures.state()  # not `self.run`: that is the User greenlet's main
        self.uid = self.fx.next_user()
        self.rng = random.Random(self.uid)
        self.queries = self.fx.queries()
        # Ingest and memory texts: the passages after the seeds, so searches and ingest use
        # different text; each user starts at its own offset.
        self.fresh = self.fx.texts[self.fx.seed_items :]
        self.cursor = self.uid * 97
        self.own_ids: collections.deque[str] = collections.deque()
        self.memory_ids: collections.deque[str] = collections.deque()
        self.anchors: set[str] = set()
        self.namespace = f"{self.fx.run_id}-u{self.uid}"

    # -- text --------------------------------------------------------------------------

    def query(self) -> str:
        return self.rng.choice(self.queries)

    def passages(self, n: int) -> list[str]:
        out = [self.fresh[(self.cursor + i) % len(self.fresh)] for i in range(n)]
        self.cursor += n
        return out

    # -- EmbedService ------------------------------------------------------------------

    @rpc_task
    def embed_query(self) -> None:
        self.embed.Embed(embed_pb2.EmbedRequest(texts=[self.query()]))

    @rpc_task
    def embed_batch(self) -> None:
        self.embed.Embed(embed_pb2.EmbedRequest(texts=self.passages(8)))

    @rpc_task
    def embed_large_batch(self) -> None:
        self.embed.Embed(embed_pb2.EmbedRequest(texts=self.passages(32)))

    @rpc_task
    def embed_stream(self) -> None:
        requests = [embed_pb2.EmbedRequest(texts=self.passages(4)) for _ in range(4)]
        for _ in self.embed.EmbedStream(iter(requests)):
            pass

    @rpc_task
    def embed_info(self) -> None:
        self.embed.Info(embed_pb2.InfoRequest())

    # -- SearchService -----------------------------------------------------------------

    @rpc_task
    def search_text(self) -> None:
        self.search.Search(
            search_pb2.SearchRequest(
                collection=self.fx.search_collection,
                text=self.query(),
                top_k=TOP_K,
                include_text=True,
            )
        )

    @rpc_task
    def search_filtered(self) -> None:
        bucket = common_pb2.Condition(field="bucket", op=common_pb2.FILTER_OP_IN)
        bucket.value.list_value.extend(self.rng.sample(range(10), 3))
        kind = common_pb2.Condition(field="kind", op=common_pb2.FILTER_OP_EQ)
        kind.value.string_value = self.rng.choice(["even", "odd"])
        self.search.Search(
            search_pb2.SearchRequest(
                collection=self.fx.search_collection,
                text=self.query(),
                top_k=TOP_K,
                include_metadata=True,
                filter=common_pb2.Filter(must=[bucket, kind]),
            )
        )

    @rpc_task
    def search_vector(self) -> None:
        vec = common_pb2.Vector(values=self.rng.choice(self.fx.query_vectors))
        self.search.Search(
            search_pb2.SearchRequest(collection=self.fx.search_collection, vector=vec, top_k=TOP_K)
        )

    # -- IndexService ------------------------------------------------------------------

    @rpc_task
    def upsert(self) -> None:
        items = []
        for text in self.passages(UPSERT_BATCH):
            n = self.cursor + len(items)
            item_id = f"u{self.uid}-{n}"
            meta = fixtures.to_struct(fixtures.item_metadata(n, text))
            items.append(common_pb2.Item(id=item_id, text=text, metadata=meta))
            self.own_ids.append(item_id)
        self.index.Upsert(
            index_pb2.UpsertRequest(collection=self.fx.ingest_collection, items=items)
        )

    @rpc_task
    def get(self) -> None:
        if not self.own_ids:
            return self.upsert()
        ids = self.rng.sample(list(self.own_ids)[-256:], min(8, len(self.own_ids)))
        self.index.Get(index_pb2.GetRequest(collection=self.fx.ingest_collection, ids=ids))

    @rpc_task
    def delete(self) -> None:
        if len(self.own_ids) < 4:
            return self.upsert()
        ids = [self.own_ids.popleft() for _ in range(4)]
        self.index.Delete(
            index_pb2.DeleteRequest(
                collection=self.fx.ingest_collection, ids=common_pb2.IdList(ids=ids)
            )
        )

    # -- MemoryService -----------------------------------------------------------------

    def _remember(self) -> str:
        (text,) = self.passages(1)
        r = self.memory.Remember(
            memory_pb2.RememberRequest(
                namespace=self.namespace,
                text=text,
                importance=self.rng.random(),
                metadata=fixtures.to_struct({"turn": self.cursor}),
            )
        )
        return r.id

    def _anchor(self) -> None:
        """An empty namespace is NOT_FOUND to Recall and ListMemories; give it a few turns."""
        self.fx.namespaces.add(self.namespace)  # for cleanup
        while len(self.anchors) < ANCHOR_MEMORIES:
            self.anchors.add(self._remember())

    @rpc_task
    def remember(self) -> None:
        self._anchor()
        mid = self._remember()
        # A deduplicated turn comes back with its old id; anchors are never forgotten.
        if mid not in self.anchors and mid not in self.memory_ids:
            self.memory_ids.append(mid)

    @rpc_task
    def recall(self) -> None:
        self._anchor()
        self.memory.Recall(
            memory_pb2.RecallRequest(namespace=self.namespace, query=self.query(), top_k=5)
        )

    @rpc_task
    def list_memories(self) -> None:
        self._anchor()
        self.memory.ListMemories(
            memory_pb2.ListMemoriesRequest(namespace=self.namespace, page_size=20)
        )

    @rpc_task
    def forget(self) -> None:
        if len(self.memory_ids) < 2:
            return self.remember()
        ids = [self.memory_ids.popleft() for _ in range(2)]
        self.memory.Forget(
            memory_pb2.ForgetRequest(namespace=self.namespace, ids=common_pb2.IdList(ids=ids))
        )


R = RagplaneUser  # tasks are its methods, weighted per scenario


class EmbedHeavy(RagplaneUser):
    """Embedding traffic: mostly single queries and small batches, some large ones."""

    tasks = {
        R.embed_query: 5,
        R.embed_batch: 3,
        R.embed_large_batch: 1,
        R.embed_stream: 1,
        R.embed_info: 1,
    }


class SearchHeavy(RagplaneUser):
    """Search on the seeded collection: by text (embedded server-side), filtered, by vector."""

    tasks = {R.search_text: 6, R.search_filtered: 3, R.search_vector: 3}


class Ingest(RagplaneUser):
    """Writes: batches of new items (embedded server-side), reads back and deletes some."""

    tasks = {R.upsert: 6, R.get: 2, R.delete: 1}


class Memory(RagplaneUser):
    """Agent memory: remember a turn, recall by query, page, forget old turns."""

    tasks = {R.remember: 4, R.recall: 5, R.list_memories: 1, R.forget: 1}


class Mixed(RagplaneUser):
    """A RAG application: search dominates, then query embeddings, memory, ingest."""

    tasks = {
        R.search_text: 10,
        R.search_filtered: 4,
        R.search_vector: 2,
        R.embed_query: 6,
        R.embed_batch: 3,
        R.embed_large_batch: 1,
        R.embed_stream: 1,
        R.embed_info: 1,
        R.recall: 4,
        R.remember: 3,
        R.list_memories: 1,
        R.forget: 1,
        R.upsert: 3,
        R.get: 1,
        R.delete: 1,
    }


SCENARIOS: dict[str, type[RagplaneUser]] = {
    "embed-heavy": EmbedHeavy,
    "search-heavy": SearchHeavy,
    "ingest": Ingest,
    "memory": Memory,
    "mixed": Mixed,
}
