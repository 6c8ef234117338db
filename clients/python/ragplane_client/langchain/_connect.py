"""The clients behind the LangChain classes: one blocking `Client` for the sync methods and
an `AsyncClient` for the async ones.

An AsyncClient must be used from one event loop, while LangChain code may call a store's
async methods from several (each `asyncio.run`, each test). So when the connection is
built from a target, each running loop gets its own AsyncClient, made on its first use
there; one the caller passes (`async_client=`) is used as it is, in the caller's loop."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any

from ragplane_client.aio import AsyncClient
from ragplane_client.client import Client


class Connection:
    """`target` ("host:port", or a list: round-robin) with Client's keyword arguments
    (api_key, tls, root_certificates, timeout, retry, ...); or `client` and, for the async
    methods, `async_client`. Clients made here are closed by `close` / `aclose`; those
    passed in stay open (they are the caller's)."""

    def __init__(
        self,
        target: str | list[str] | None = None,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if target is not None and (client is not None or async_client is not None):
            raise ValueError("pass target= (with its options) or client= / async_client=, not both")
        if target is None and client is None and async_client is None:
            raise ValueError("pass target='host:port', or client= (and async_client=)")
        options = dict(client_options or {})
        self._target, self._options = target, options
        self._owned = target is not None
        self._client = Client(target, **options) if target is not None else client
        self._async_client = async_client
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def sync(self) -> Client:
        if self._client is None:
            raise ValueError(
                "the sync methods need client= (a ragplane_client.Client) or target=; this "
                "one was given only async_client="
            )
        return self._client

    @property
    def aio(self) -> AsyncClient:
        """The AsyncClient for the running event loop."""
        if self._async_client is not None:
            return self._async_client
        if not self._owned:
            raise ValueError(
                "the async methods need async_client= (a ragplane_client.AsyncClient) or "
                "target=; this one was given only client="
            )
        loop = asyncio.get_running_loop()
        c = self._per_loop.get(loop)
        if c is None:
            c = self._per_loop[loop] = AsyncClient(self._target, **self._options)
        return c

    def close(self) -> None:
        """Close the blocking client made here (async clients: `aclose`)."""
        if self._owned and self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Close the running loop's AsyncClient made here."""
        if self._owned:
            c = self._per_loop.pop(asyncio.get_running_loop(), None)
            if c is not None:
                await c.close()
