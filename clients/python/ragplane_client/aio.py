"""`AsyncClient`: the same methods as `Client`, as coroutines over grpc.aio.

Channels are opened on first use, in the running event loop, so the client may be made
anywhere but must be used (and closed) from one loop:

    async with AsyncClient("127.0.0.1:50051") as c:
        hits = await c.search("docs", "where is data kept?", top_k=5)
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from ragplane_client import _ops as ops
from ragplane_client._transport import DEFAULT_TARGET, RetryPolicy, Stubs, config, retry_after
from ragplane_client._transport import aio_channel as _channel
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


class AsyncClient:
    """A ragplane client for asyncio; the arguments are Client's (see its docstring).
    Errors are grpc.aio.AioRpcError (a grpc.RpcError)."""

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
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Stubs] = []
        self._next = itertools.count()
        self._token = ""

    @property
    def stubs(self) -> Stubs:
        """Generated grpc.aio stubs for any other RPC (admin, EmbedStream), with the API key,
        on the next target's channel; no retries. Use inside the event loop."""
        if not self._channels:
            self._channels = [_channel(self._cfg, t) for t in self._cfg.targets]
            self._stubs = [Stubs.of(ch) for ch in self._channels]
        return self._stubs[next(self._next) % len(self._stubs)]

    async def close(self) -> None:
        """Close the channels; a later call opens new ones (in the loop it runs in)."""
        channels, self._channels, self._stubs = self._channels, [], []
        for ch in channels:
            await ch.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def last_consistency_token(self) -> str:
        """The furthest consistency_token any reply to this client carried (a PostgreSQL
        store; "" with the embedded one): pass it as a read's `consistency_token=` to read
        everything this client wrote, on whichever server answers."""
        return self._token

    def _saw(self, token: str) -> None:
        if token:
            self._token = ops.newer(self._token, token)

    async def _run(self, op: ops.Op[T]) -> T:
        policy, timeout = self._cfg.retry, op.timeout or self._cfg.timeout
        for attempt in itertools.count():
            method = getattr(getattr(self.stubs, op.rpc.service), op.rpc.method)
            try:
                reply = await method(op.request, timeout=timeout)
                self._saw(ops.reply_token(reply))
                return op.convert(reply)
            except grpc.RpcError as exc:
                if not policy.retries(exc, attempt, op.rpc.idempotent):
                    raise
                await asyncio.sleep(policy.delay(attempt, retry_after(exc)))
        raise AssertionError("unreachable")

    # --- embeddings ----------------------------------------------------------------------

    async def embed(
        self,
        texts: Sequence[str],
        *,
        normalize: bool | None = None,
        truncate: bool | None = None,
        use_case: str = "",
        timeout: float | None = None,
    ) -> Embeddings:
        return await self._run(ops.embed(texts, normalize, truncate, use_case, timeout))

    async def embedder_info(self, *, timeout: float | None = None) -> EmbedderInfo:
        return await self._run(ops.embedder_info(timeout))

    # --- collections ---------------------------------------------------------------------

    async def create_collection(
        self, name: str, *, exist_ok: bool = False, **options: Unpack[CollectionOptions]
    ) -> CollectionInfo:
        """As Client.create_collection: with exist_ok, a collection of that name that agrees
        with the options asked for is returned (described) instead of ALREADY_EXISTS."""
        try:
            return await self._run(ops.create_collection(name, dict(options)))
        except grpc.RpcError as exc:
            if not (exist_ok and ops.already_exists(exc)):
                raise
        info = await self._run(ops.describe_collection(name, options.get("timeout")))
        return ops.same_settings(info, options)

    async def list_collections(
        self, *, timeout: float | None = None, consistency_token: str = ""
    ) -> list[CollectionInfo]:
        return await self._run(ops.list_collections(timeout, consistency_token))

    async def describe_collection(
        self, name: str, *, timeout: float | None = None, consistency_token: str = ""
    ) -> CollectionInfo:
        return await self._run(ops.describe_collection(name, timeout, consistency_token))

    async def delete_collection(self, name: str, *, timeout: float | None = None) -> bool:
        return await self._run(ops.delete_collection(name, timeout))

    # --- items ---------------------------------------------------------------------------

    async def upsert(
        self,
        collection: str,
        items: Iterable[Item | Mapping[str, Any]],
        *,
        batch_size: int = 256,
        batch_bytes: int = 4 * 1024 * 1024,
        timeout: float | None = None,
    ) -> UpsertResult:
        """As Client.upsert: batches one after another, each retried on its own."""
        totals = ops.UpsertTotals()
        for op in ops.upserts(collection, items, batch_size, batch_bytes, timeout):
            totals.add(await self._run(op))
        return totals.result()

    async def get(
        self,
        collection: str,
        ids: Sequence[str],
        *,
        include_vectors: bool = False,
        timeout: float | None = None,
        consistency_token: str = "",
    ) -> list[Item]:
        op = ops.get(collection, ids, include_vectors, timeout, consistency_token)
        return await self._run(op)

    async def delete(
        self,
        collection: str,
        ids: Sequence[str] | None = None,
        *,
        filter: Any = None,
        timeout: float | None = None,
    ) -> int:
        return await self._run(ops.delete(collection, ids, filter, timeout))

    async def search(
        self, collection: str, query: str | Sequence[float], **options: Unpack[SearchOptions]
    ) -> SearchResult:
        return await self._run(ops.search(collection, query, dict(options)))

    # --- memory --------------------------------------------------------------------------

    async def remember(
        self,
        namespace: str,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        importance: float | None = None,
        ttl_seconds: int = 0,
        timeout: float | None = None,
    ) -> Remembered:
        op = ops.remember(namespace, text, metadata, importance, ttl_seconds, timeout)
        return await self._run(op)

    async def recall(
        self, namespace: str, query: str, **options: Unpack[RecallOptions]
    ) -> list[Memory]:
        return await self._run(ops.recall(namespace, query, dict(options)))

    async def forget(
        self,
        namespace: str,
        ids: Sequence[str] | None = None,
        *,
        filter: Any = None,
        all: bool = False,
        timeout: float | None = None,
    ) -> int:
        return await self._run(ops.forget(namespace, ids, filter, all, timeout))

    async def list_memories(
        self,
        namespace: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
        consistency_token: str = "",
    ) -> MemoryPage:
        op = ops.list_memories(namespace, page_size, page_token, timeout, consistency_token)
        return await self._run(op)

    async def iter_memories(
        self, namespace: str, *, page_size: int = 100, consistency_token: str = ""
    ) -> AsyncIterator[Memory]:
        token = ""
        while True:
            page = await self.list_memories(
                namespace,
                page_size=page_size,
                page_token=token,
                consistency_token=consistency_token,
            )
            for m in page.memories:
                yield m
            token = page.next_page_token
            if not token:
                return
