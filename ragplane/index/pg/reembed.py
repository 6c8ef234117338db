"""A re-embedding rebuild in a cluster: embedded once, on the server that runs it.

That server records every vector its re-embedder returns (by the text's sha256) and stores
them in `rp_embeddings` with the rebuild's change; `rp_items` gets the new vectors too (a
server that loads from the tables later gets them). The other servers rebuild the same
generation from the same rows, reading those vectors back (`changes.Rebuild`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

from ragplane.core.errors import FailedPrecondition

UPDATE_BATCH = 1000


class Recording:
    """`inner` (a plain re-embedder or a BulkReembed) that keeps text -> vector bytes."""

    def __init__(self, inner: Callable[[list[str]], Any]) -> None:
        self.inner = inner
        self.vectors: dict[str, bytes] = {}
        if hasattr(inner, "stream"):
            self.stream = self._stream

    @property
    def where(self) -> str:  # what the progress reports say (a Ray cluster's, say)
        return getattr(self.inner, "where", "")

    def _keep(self, texts: list[str], out: Any) -> Any:
        mat = np.asarray(out, dtype="<f4")
        if mat.ndim == 2 and mat.shape[0] == len(texts):
            for t, row in zip(texts, mat, strict=True):
                self.vectors[t] = row.tobytes()
        return out

    def __call__(self, texts: list[str]) -> Any:
        return self._keep(texts, self.inner(texts))

    def _stream(self, batches: Iterable[list[str]]) -> Iterator[Any]:
        given: deque[list[str]] = deque()

        def noted() -> Iterator[list[str]]:
            for b in batches:
                given.append(b)
                yield b

        for out in getattr(self.inner, "stream")(noted()):  # noqa: B009 - there, per init
            yield self._keep(given.popleft(), out)


def item_texts(body: dict[str, Any]) -> list[str]:
    """The texts an item's rows were embedded from: its chunks', or its whole text."""
    text = body["text"]
    spans = body.get("chunks")
    return [text[s:e] for s, e in spans] if spans else [text]


def revector_items(c: Any, key: tuple[str, str, str], vectors: dict[str, bytes],
                   embedder: str) -> int:
    """Give every item of the collection `key` (tenant, kind, name) its new vectors."""
    rows = c.execute(
        "SELECT id, body FROM rp_items WHERE tenant = %s AND kind = %s AND coll = %s", key
    ).fetchall()
    updates = []
    for item_id, body in rows:
        try:
            blob = b"".join(vectors[t] for t in item_texts(body))
        except KeyError:
            raise FailedPrecondition(
                f"the rebuild did not re-embed item {item_id!r}; nothing was changed"
            ) from None
        updates.append((blob, *key, item_id))
    with c.cursor() as cur:
        for lo in range(0, len(updates), UPDATE_BATCH):
            cur.executemany(
                "UPDATE rp_items SET vectors = %s WHERE tenant = %s AND kind = %s AND coll = %s "
                "AND id = %s",
                updates[lo : lo + UPDATE_BATCH],
            )
    c.execute(
        "UPDATE rp_collections SET config = config || %s WHERE tenant = %s AND kind = %s "
        "AND name = %s",
        (Jsonb({"embedder": embedder}), *key),
    )
    return len(updates)
