"""A throwaway PostgreSQL per test module (ragplane.testkit.postgres), a database per test."""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture
def db_url(pg) -> str:
    """A new, empty database of the module's PostgreSQL."""
    return pg.create_database(f"t{next(_names)}")


@pytest.fixture
def pg_store(db_url):
    """A migrated PgStore on a new database; `pg_store.url` reaches the same one."""
    from ragplane.index.pg.log import PgStore

    store = PgStore(db_url)
    store.migrate()
    yield store
    store.close()
