"""What PostgreSQL's errors mean to a client, and which leave a connection fit to reuse.

Every error the store's statements can raise becomes a domain error with a status a client
can act on (`ragplane.server.interceptors`' table), by its SQLSTATE class:

- transient: the connection lost or refused (08, no SQLSTATE: the line went down), the
  server shutting down or restarting (57P0x), a cancelled or lock-timed-out statement
  (57014, 55P03), a rolled-back transaction (40: serialization, deadlock), resources
  short (53), an I/O error (58), a read-only server (25006: a standby after a failover),
  PostgreSQL's own internal error (XX000), a prepared statement gone (26000) or a
  transaction left aborted (25P02) -> Unavailable with retry-after;
- the request's values refused (22), a program limit (54) -> InvalidArgument;
- a constraint another server's write broke (23) -> Unavailable (retrying sees it first);
- the schema, the database or the rights not what this server needs (42P01, 42703,
  42883, 3D000, 42501, 28) -> FailedPrecondition: an operator has to act;
- damaged data (XX001, XX002) -> Corrupt.

Anything else (a syntax error, a client-side misuse) is a bug here and stays unmapped:
INTERNAL with its traceback logged.

A connection that saw a server-side error of a statement (22, 23, 40, 42, 54, 55P03,
57014) is clean once its transaction is rolled back and is reused; after anything else
(the line, the protocol, a prepared statement, an aborted pipeline) it is discarded."""

from __future__ import annotations

import psycopg
import psycopg_pool

from ragplane.core.errors import (
    Corrupt,
    FailedPrecondition,
    InvalidArgument,
    RagplaneError,
    Unavailable,
)

RETRY_AFTER = 1.0

_TRANSIENT = ("08", "40", "53", "57", "58", "55P03", "25006", "25P02", "26000", "XX000")
_INPUT = ("22", "54")
_OPERATOR = ("42P01", "42703", "42883", "42704", "3D000", "42501", "28", "3F000")
_DAMAGED = ("XX001", "XX002")
_CLEAN = ("22", "23", "40", "42", "54", "55P03", "57014", "P0")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _matches(state: str, prefixes: tuple[str, ...]) -> bool:
    return any(state.startswith(p) for p in prefixes)


def translate(exc: BaseException, where: str) -> RagplaneError | None:
    """The domain error for a psycopg or pool error (None: a bug, left as it is).
    `where` names the server in messages (the URL without its password)."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return Unavailable(f"PostgreSQL ({where}) is unreachable: {_first_line(exc)}; retry",
                           RETRY_AFTER)
    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate or ""
    first = _first_line(exc)
    if (not state and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)) or (
        _matches(state, ("08", "57P"))
    ):  # the line lost, refused or cut by a shutdown
        return Unavailable(f"PostgreSQL ({where}) is unreachable: {first}; retry", RETRY_AFTER)
    if _matches(state, _TRANSIENT):
        return Unavailable(f"PostgreSQL ({where}) is unavailable: {first}; retry", RETRY_AFTER)
    if state.startswith("23"):
        return Unavailable(
            f"another server's write conflicted with this one ({first}); retry", RETRY_AFTER
        )
    if _matches(state, _INPUT):
        return InvalidArgument(f"PostgreSQL refused the request ({first}); correct it and retry")
    if _matches(state, _OPERATOR):
        return FailedPrecondition(
            f"PostgreSQL ({where}) refused this server ({state}: {first}): the database, its "
            "schema or this server's rights are not what this version needs; an operator "
            "has to fix that before a retry can succeed"
        )
    if _matches(state, _DAMAGED):
        return Corrupt(f"PostgreSQL ({where}) reports damaged data ({first}); restore it")
    return None


def refused(exc: BaseException) -> bool:
    """Whether `exc` is the server's refusal of a statement (its transaction is known to
    have failed: nothing committed), not a lost line, a shutdown or a protocol failure."""
    if not isinstance(exc, psycopg.Error) or isinstance(
        exc, psycopg.InterfaceError | psycopg.errors.PipelineAborted
    ):
        return False
    state = exc.sqlstate or ""
    return bool(state) and not _matches(state, ("08", "57P"))


def reusable(exc: BaseException) -> bool:
    """Whether a connection whose block raised `exc` is fit to serve again (after its
    rollback): yes after an error of ours or a statement's own error on a connection still
    in step with the server; no after a lost line, a protocol or pipeline error, or a
    prepared statement gone missing. A domain error raised from a psycopg one (a conflict,
    an outcome unknown at commit) is judged by that one."""
    seen: BaseException | None = exc
    for _ in range(4):  # the psycopg error a domain error was raised from, if any
        if seen is None or isinstance(seen, psycopg.Error):
            break
        seen = seen.__cause__ or seen.__context__
    return not isinstance(seen, psycopg.Error) or (
        refused(seen) and _matches(seen.sqlstate or "", _CLEAN)
    )
