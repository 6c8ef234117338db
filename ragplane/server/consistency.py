"""Read-your-writes on any server of a cluster (a PostgreSQL store): Milvus's Session
consistency, with the change log's position as the token.

Every reply with a `consistency_token` field gets the position this server has applied
(after a write: at least the write's own). A request carrying one waits until this server
has applied it, up to `consistency_wait_ms`, then answers UNAVAILABLE with retry-after and
the lag. Every call of the store's services answers UNAVAILABLE while this server cannot
reach PostgreSQL or has not caught up (the embedding service does not need the store)."""

from __future__ import annotations

from typing import Any

from ragplane.core.errors import InvalidArgument
from ragplane.index.backend import Follower

STORE_SERVICES = (
    "/ragplane.v1.IndexService/",
    "/ragplane.v1.SearchService/",
    "/ragplane.v1.MemoryService/",
)
FIELD = "consistency_token"


class Gate:
    def __init__(self, follower: Follower, wait_ms: int) -> None:
        self.follower = follower
        self.wait = max(0, wait_ms) / 1000.0
        self.prefix = follower.store_id[:8]

    def applies(self, method: str) -> bool:
        return method.startswith(STORE_SERVICES)

    def token(self, pos: int) -> str:
        return f"{self.prefix}.{pos}"

    def parse(self, token: str) -> int:
        prefix, _, pos = token.partition(".")
        if prefix != self.prefix or not pos.isdigit():
            raise InvalidArgument(
                f"consistency_token {token[:40]!r} is not one this cluster gave (tokens come "
                "from the consistency_token of a write's reply); leave it empty to read "
                "without waiting"
            )
        return int(pos)

    def before(self, request: Any) -> None:
        self.follower.check()
        token = getattr(request, FIELD, "")
        if token:
            self.follower.wait_for(self.parse(token), self.wait)

    def after(self, response: Any) -> Any:
        if response is not None and FIELD in response.DESCRIPTOR.fields_by_name:
            setattr(response, FIELD, self.token(self.follower.applied))
        return response
