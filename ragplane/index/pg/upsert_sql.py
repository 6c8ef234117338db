"""The statements of an upsert on the shared store and the meaning of their errors
(`ragplane.index.pg.engine.PgEngine.upsert`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from ragplane.core.errors import InvalidArgument
from ragplane.index.pg import failures
from ragplane.index.pg.log import CHANNEL

# One statement per upsert (arrays unnested server-side): executemany's row-at-a-time
# statements cost more than the local SQLite write they stand beside.

_ITEMS = (
    "INSERT INTO rp_items (tenant, kind, coll, id, pos, body, vectors) "
    "SELECT %s, %s, %s, b->>'id', h.pos, b, v FROM {head} h, unnest("
    "ARRAY(SELECT jsonb_array_elements(%s::text::jsonb)), %b::bytea[]) AS t(b, v)"
)
_ON_CONFLICT = (
    " ON CONFLICT (tenant, kind, coll, id) DO UPDATE "
    "SET pos = EXCLUDED.pos, body = EXCLUDED.body, vectors = EXCLUDED.vectors"
)
# The head already bumped in this transaction (a write that holds its lock).
UPSERT_ITEMS = _ITEMS.format(head="rp_head") + _ON_CONFLICT
# An upsert sent ahead, as one statement: the head's bump guarded by the position this
# server expects (another server's write first: no row, nothing written), the items
# (new ids by a plain INSERT: no speculative insertion), the NOTIFY and the log entry.
_AHEAD = (
    "WITH h AS (UPDATE rp_head SET pos = pos + 1 WHERE pos = %s RETURNING pos), "
    "i AS ({items}), "
    "n AS (SELECT pg_notify('" + CHANNEL + "', pos::text) FROM h), "
    "l AS (INSERT INTO rp_changes (pos, op, at) "
    "SELECT pos, %s, clock_timestamp() FROM h) "
    "SELECT pos, (SELECT count(*) FROM n) FROM h"
)
AHEAD_NEW = _AHEAD.format(items=_ITEMS.format(head="h"))
AHEAD_ANY = _AHEAD.format(items=_ITEMS.format(head="h") + _ON_CONFLICT)


class Behind(Exception):
    """Raised inside a write that found another server's change before its own."""


def drain(pipe: psycopg.Pipeline) -> None:
    """Close a pipeline that an error aborted (rather than have its exit log a warning)."""
    with contextlib.suppress(psycopg.Error):
        pipe.sync()


@contextlib.contextmanager
def outcome(committing: Any = None) -> Iterator[None]:
    """Errors of a pipelined upsert: another server's write first is Behind, input
    PostgreSQL refuses (duplicate ids, a NUL character) InvalidArgument; with the COMMIT
    sent (`committing`: the PgStore), a line lost leaves the outcome unknown. The rest
    go on to the store's translation (`failures`)."""
    try:
        yield
    except (psycopg.errors.SerializationFailure, psycopg.errors.UniqueViolation) as exc:
        raise Behind from exc  # (an id new here but not there: another server's write)
    except (psycopg.errors.DataError, psycopg.errors.CardinalityViolation) as exc:
        first = str(exc).strip().splitlines()[0]
        raise InvalidArgument(
            f"PostgreSQL refused these items ({first}); correct the items and retry"
        ) from exc
    except psycopg.Error as exc:
        if committing is None or failures.refused(exc):
            raise
        raise committing.lost_at_commit() from exc
