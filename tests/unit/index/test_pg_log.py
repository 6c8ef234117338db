"""The PostgreSQL store's pieces that need no PostgreSQL: the change codec, the URL in
messages, a commit whose outcome is unknown, and an unreachable server."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import psycopg
import pytest

from ragplane.core.errors import Unavailable
from ragplane.index.pg import codec
from ragplane.index.pg.log import PgStore, redact
from ragplane.index.types import Record, Span
from ragplane.testkit.postgres import free_port


def test_records_round_trip_through_the_codec_with_chunks_and_types():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((3, 4)).astype(np.float32)
    recs = [
        Record(
            "a", v[0], "plain text", {"n": 1, "f": 2.5, "b": True, "l": [1, "x"], "d": {"k": None}}
        ),
        Record("b", None, "chunked text here", {}, [Span(0, 7, v[1]), Span(5, 17, v[2])]),
    ]
    items, blob = codec.encode_items(recs), b"".join(codec.item_vectors(recs))
    back = codec.decode_records(items, blob, 4)
    assert [r.id for r in back] == ["a", "b"]
    assert back[0].metadata == recs[0].metadata and back[0].text == "plain text"
    np.testing.assert_array_equal(back[0].vector, v[0])
    assert [(s.start, s.end) for s in back[1].chunks] == [(0, 7), (5, 17)]
    np.testing.assert_array_equal(back[1].chunks[1].vector, v[2])
    assert back[1].vector is None


def test_messages_name_the_server_without_the_password():
    assert redact("postgresql://alice:s3cret@db.example:6432/rag") == (
        "postgresql://alice@db.example:6432/rag"
    )
    assert "s3cret" not in redact("postgresql://alice:s3cret@db/rag")


class _LostAtCommit:
    """A connection that takes every statement but loses the line at COMMIT."""

    info = type("Info", (), {"transaction_status": psycopg.pq.TransactionStatus.INTRANS})

    def __init__(self) -> None:
        self.statements: list[str] = []

    def execute(self, sql: str, *args: object) -> _LostAtCommit:
        self.statements.append(sql)
        if sql == "COMMIT":
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return self

    def nextset(self) -> bool:
        return True

    def fetchone(self) -> tuple[int]:
        return (7,)


def test_a_connection_lost_at_commit_says_the_outcome_is_unknown(monkeypatch):
    store = PgStore.__new__(PgStore)
    store.where = "postgresql://u@h:5432/db"
    store._held = threading.local()
    conn = _LostAtCommit()
    monkeypatch.setattr(store, "conn", lambda: contextlib.nullcontext(conn))
    with pytest.raises(Unavailable) as err:
        with store.write() as (c, pos):
            assert pos == 7
    assert "outcome is unknown" in str(err.value) and "idempotent" in str(err.value)
    assert err.value.retry_after > 0
    assert conn.statements[0].startswith("BEGIN") and conn.statements[-1] == "COMMIT"


def test_an_unreachable_postgresql_is_unavailable_within_about_a_second():
    store = PgStore(f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    try:
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as err:
            store.head()
        assert time.monotonic() - t0 < 3.0
        assert "is unreachable" in str(err.value) and "retry" in str(err.value)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("sqlstate", "status", "reuse"),
    [
        ("08006", "Unavailable", False),  # connection failure
        ("57P01", "Unavailable", False),  # admin shutdown (a restart)
        ("57P02", "Unavailable", False),  # crash shutdown
        ("57P03", "Unavailable", False),  # cannot connect now (recovering)
        ("40001", "Unavailable", True),  # serialization failure: retries exhausted
        ("40P01", "Unavailable", True),  # deadlock
        ("55P03", "Unavailable", True),  # lock not available (the head, past the budget)
        ("53300", "Unavailable", False),  # too many connections
        ("25006", "Unavailable", False),  # read-only: a standby after a failover
        ("26000", "Unavailable", False),  # a prepared statement gone: never reuse
        ("XX000", "Unavailable", False),
        ("23505", "Unavailable", True),  # a duplicate key another server's write made
        ("22021", "InvalidArgument", True),  # a NUL in text
        ("54000", "InvalidArgument", True),
        ("42P01", "FailedPrecondition", True),  # the schema is not there
        ("42501", "FailedPrecondition", True),  # rights
        ("XX001", "Corrupt", False),
        ("42601", None, True),  # a syntax error is a bug here: INTERNAL
    ],
)
def test_every_postgresql_error_class_maps_to_a_status_a_client_can_act_on(
    sqlstate, status, reuse
):
    from ragplane.index.pg import failures

    exc = psycopg.errors.lookup(sqlstate)("refused")
    got = failures.translate(exc, "postgresql://u@h:5432/db")
    assert (type(got).__name__ if got is not None else None) == status
    if status == "Unavailable":
        assert got.retry_after > 0 and "retry" in str(got)
    assert failures.reusable(exc) is reuse


def test_a_lost_line_and_the_pool_are_unavailable_and_the_connection_is_discarded():
    import psycopg_pool

    from ragplane.index.pg import failures

    for exc in (psycopg.OperationalError("server closed the connection unexpectedly"),
                psycopg.InterfaceError("the connection is closed"),
                psycopg_pool.PoolTimeout("couldn't get a connection after 0.70 sec")):
        got = failures.translate(exc, "db")
        assert isinstance(got, Unavailable) and got.retry_after > 0
        assert not failures.reusable(exc)
    try:  # a domain error raised from a lost line: judged by that line
        try:
            raise psycopg.OperationalError("lost")
        except psycopg.OperationalError as inner:
            raise Unavailable("outcome unknown") from inner
    except Unavailable as outer:
        assert not failures.reusable(outer)
    assert failures.reusable(ValueError("ours"))
