"""`Client`: ragplane over blocking gRPC calls. Safe to share between threads."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from ragplane_client import _ops as ops
from ragplane_client._transport import DEFAULT_TARGET, RetryPolicy, Stubs, config, retry_after
from ragplane_client._transport import sync_channel as _channel
from ragplane_client.types import (
    CollectionInfo,
    EmbedderInfo,
    Embeddings,
    Item,
    Memory,
    MemoryPage,
    Remembered,
    SearchResult,
    UpsertResult,
)

if TYPE_CHECKING:
    from typing import Unpack

    from ragplane_client.types import CollectionOptions, RecallOptions, SearchOptions

T = TypeVar("T")


class Client:
    """A ragplane client.

    targets: "host:port" (or any gRPC target, e.g. "dns:///ragplane.internal:443"), or a
        list of them: calls go round-robin over one channel per target, and a retried call
        goes to the next one. For gRPC's own load balancing over the addresses of one DNS
        name, pass one "dns:///..." target and channel_options=[("grpc.lb_policy_name",
        "round_robin")].
    api_key: sent on every call as `authorization: Bearer <key>`. Refused without TLS unless
        allow_plaintext_key (a loopback port, or a sidecar that terminates TLS).
    tls: TLS with the system's roots; root_certificates (PEM bytes or a path) trusts a
        private CA and implies tls; client_certificate with client_key is mutual TLS.
    timeout: seconds per attempt of every call (None = no deadline); each method's
        `timeout=` overrides it.
    retry: bounded retries of RESOURCE_EXHAUSTED and UNAVAILABLE that honour the server's
        `retry-after` (see RetryPolicy); NO_RETRY turns them off.
    max_message_bytes: gRPC message limit both ways (the server's default is 64 MiB).
    channel_options: more gRPC channel options, as (name, value) pairs.

    Several servers of one cluster (a shared PostgreSQL store): pass them as the list of
    targets. Write results carry a `consistency_token` and reads take `consistency_token=`:
    the server that answers waits until it has applied that write (`last_consistency_token`
    is the furthest one this client's replies carried).

    Errors are grpc.RpcError: `e.code()` (INVALID_ARGUMENT, NOT_FOUND, ...) and
    `e.details()` say what to change. Arguments the client can check itself raise
    ValueError or TypeError before any call.
    """

    def __init__(
        self,
        targets: str | Sequence[str] = DEFAULT_TARGET,
        *,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | str | Path | None = None,
        client_certificate: bytes | str | Path | None = None,
        client_key: bytes | str | Path | None = None,
        allow_plaintext_key: bool = False,
        timeout: float | None = 30.0,
        retry: RetryPolicy | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._cfg = config(
            targets, api_key=api_key, tls=tls, root_certificates=root_certificates,
            client_certificate=client_certificate, client_key=client_key,
            allow_plaintext_key=allow_plaintext_key, timeout=timeout, retry=retry,
            max_message_bytes=max_message_bytes, channel_options=channel_options,
        )  # fmt: skip
        self._channels = [_channel(self._cfg, t) for t in self._cfg.targets]
        self._stubs = [Stubs.of(ch) for ch in self._channels]
        self._next = itertools.count()
        self._token = ""
        self._lock = threading.Lock()

    @property
    def stubs(self) -> Stubs:
        """Generated stubs for any other RPC (admin, EmbedStream), with the API key, on the
        next target's channel (each access moves the round-robin on); no retries."""
        return self._stubs[next(self._next) % len(self._stubs)]

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def last_consistency_token(self) -> str:
        """The furthest consistency_token any reply to this client carried (a PostgreSQL
        store; "" with the embedded one): pass it as a read's `consistency_token=` to read
        everything this client wrote, on whichever server answers."""
        return self._token

    def _saw(self, token: str) -> None:
        if token:
            with self._lock:
                self._token = ops.newer(self._token, token)

    def _run(self, op: ops.Op[T]) -> T:
        policy, timeout = self._cfg.retry, op.timeout or self._cfg.timeout
        for attempt in itertools.count():
            method = getattr(getattr(self.stubs, op.rpc.service), op.rpc.method)
            try:
                reply = method(op.request, timeout=timeout)
                self._saw(ops.reply_token(reply))
                return op.convert(reply)
            except grpc.RpcError as exc:
                if not policy.retries(exc, attempt, op.rpc.idempotent):
                    raise
                time.sleep(policy.delay(attempt, retry_after(exc)))
        raise AssertionError("unreachable")

    # --- embeddings ----------------------------------------------------------------------

    def embed(
        self,
        texts: Sequence[str],
        *,
        normalize: bool | None = None,
        truncate: bool | None = None,
        use_case: str = "",
        timeout: float | None = None,
    ) -> Embeddings:
        """One vector per text, in order (L2-normalised and truncated at the model's window
        unless told otherwise), from the serving embedder of `use_case` ("embeddings")."""
        return self._run(ops.embed(texts, normalize, truncate, use_case, timeout))

    def embedder_info(self, *, timeout: float | None = None) -> EmbedderInfo:
        return self._run(ops.embedder_info(timeout))

    # --- collections ---------------------------------------------------------------------

    def create_collection(
        self, name: str, *, exist_ok: bool = False, **options: Unpack[CollectionOptions]
    ) -> CollectionInfo:
        """Create a collection: metric ("cosine", "ip", "l2"), index_type ("flat", "hnsw",
        "ivf_pq"), dim (0 = the embedder's), params, lexical_index (default on), chunking
        (default on at the embedder's window; False, True, a dict or a Chunking).

        With exist_ok, a collection of that name is returned (described) instead of
        ALREADY_EXISTS, so a script can run twice; ValueError if it differs from the
        metric, index_type, dim, lexical_index or chunking on/off asked for."""
        try:
            return self._run(ops.create_collection(name, dict(options)))
        except grpc.RpcError as exc:
            if not (exist_ok and ops.already_exists(exc)):
                raise
        info = self._run(ops.describe_collection(name, options.get("timeout")))
        return ops.same_settings(info, options)

    def list_collections(
        self, *, timeout: float | None = None, consistency_token: str = ""
    ) -> list[CollectionInfo]:
        return self._run(ops.list_collections(timeout, consistency_token))

    def describe_collection(
        self, name: str, *, timeout: float | None = None, consistency_token: str = ""
    ) -> CollectionInfo:
        return self._run(ops.describe_collection(name, timeout, consistency_token))

    def delete_collection(self, name: str, *, timeout: float | None = None) -> bool:
        """True when it existed."""
        return self._run(ops.delete_collection(name, timeout))

    # --- items ---------------------------------------------------------------------------

    def upsert(
        self,
        collection: str,
        items: Iterable[Item | Mapping[str, Any]],
        *,
        batch_size: int = 256,
        batch_bytes: int = 4 * 1024 * 1024,
        timeout: float | None = None,
    ) -> UpsertResult:
        """Insert or replace items by id, in batches of at most `batch_size` items and
        about `batch_bytes` bytes, one after another (each retried on its own; upserts
        are idempotent). Items are Item or dicts with id, text, vector, metadata; without
        a vector the server embeds the text. An error stops at its batch: earlier batches
        stay written."""
        totals = ops.UpsertTotals()
        for op in ops.upserts(collection, items, batch_size, batch_bytes, timeout):
            totals.add(self._run(op))
        return totals.result()

    def get(
        self,
        collection: str,
        ids: Sequence[str],
        *,
        include_vectors: bool = False,
        timeout: float | None = None,
        consistency_token: str = "",
    ) -> list[Item]:
        """The items found, in the order of `ids` (missing ids are left out)."""
        op = ops.get(collection, ids, include_vectors, timeout, consistency_token)
        return self._run(op)

    def delete(
        self,
        collection: str,
        ids: Sequence[str] | None = None,
        *,
        filter: Any = None,
        timeout: float | None = None,
    ) -> int:
        """Delete the items with these ids, or those matching `filter`; returns how many."""
        return self._run(ops.delete(collection, ids, filter, timeout))

    def search(
        self, collection: str, query: str | Sequence[float], **options: Unpack[SearchOptions]
    ) -> SearchResult:
        """The `top_k` (10) items best matching `query` (text, or a vector for dense mode).

        mode: "dense" (default), "lexical" (BM25) or "hybrid" (both, fused by `fusion`:
        "weighted" (default) or "rrf", with `rrf_k` and `dense_weight`). filter: see
        ragplane_client.filters. chunks_per_hit: passages per hit (default 1). group_by: a
        metadata field; the result then has `groups` (group_size hits each, up to
        group_limit groups) and no hits. include_text and include_metadata default True.
        params: a SearchParams (or dict) for dense mode: ef_search, nprobe, exact,
        oversampling (unset = the collection's defaults)."""
        return self._run(ops.search(collection, query, dict(options)))

    # --- memory --------------------------------------------------------------------------

    def remember(
        self,
        namespace: str,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        importance: float | None = None,
        ttl_seconds: int = 0,
        timeout: float | None = None,
    ) -> Remembered:
        """Store a memory (a near-identical one is updated instead: deduplicated=True).
        importance in [0, 1] (default 0.5); ttl_seconds 0 = never expires."""
        return self._run(ops.remember(namespace, text, metadata, importance, ttl_seconds, timeout))

    def recall(self, namespace: str, query: str, **options: Unpack[RecallOptions]) -> list[Memory]:
        """The `top_k` (5) memories best matching `query` by relevance, recency and
        importance (each memory's `parts`); mode, filter and fusion as in search."""
        return self._run(ops.recall(namespace, query, dict(options)))

    def forget(
        self,
        namespace: str,
        ids: Sequence[str] | None = None,
        *,
        filter: Any = None,
        all: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Forget memories by ids, by filter, or all=True; returns how many."""
        return self._run(ops.forget(namespace, ids, filter, all, timeout))

    def list_memories(
        self,
        namespace: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
        consistency_token: str = "",
    ) -> MemoryPage:
        """One page of a namespace's memories; pass `next_page_token` for the next."""
        op = ops.list_memories(namespace, page_size, page_token, timeout, consistency_token)
        return self._run(op)

    def iter_memories(
        self, namespace: str, *, page_size: int = 100, consistency_token: str = ""
    ) -> Iterator[Memory]:
        """Every memory of the namespace, page by page."""
        token = ""
        while True:
            page = self.list_memories(
                namespace,
                page_size=page_size,
                page_token=token,
                consistency_token=consistency_token,
            )
            yield from page.memories
            token = page.next_page_token
            if not token:
                return
