"""The store page of a server on a PostgreSQL store: its position in the log, the servers
connected to the store (this one and another) and the leases held, from PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.testkit.postgres import available
from tests.console.conftest import ADMIN_KEY, free_port
from tests.console.test_console_http import call

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not available(), reason="PostgreSQL's server binaries are not installed"),
]


def test_the_store_page_shows_the_servers_connected_and_the_leases_held(pg, tmp_path):
    url = pg.create_database("console_store")
    port = free_port()
    srv = InProcessServer(
        tmp_path / "data", embedder=FakeEmbedder(), store=url, http_port=port,
        bootstrap_admin_key=ADMIN_KEY,
    )  # fmt: skip
    other = psycopg.connect(url, autocommit=True, application_name="ragplane other-host:7")
    try:
        other.execute("SELECT pg_advisory_lock(hashtextextended('once/memory-sweep', 0))")
        status, _, html = call(f"http://127.0.0.1:{port}/console/store", key=ADMIN_KEY)
        assert status == 200, html[:500]
        servers = html[html.index('id="servers"') : html.index('id="leases"')]
        assert "ragplane other-host:7" in servers and "(this one)" in servers
        leases = html[html.index('id="leases"') :]
        assert "once/memory-sweep" in leases and "ragplane other-host:7" in leases
        assert "applied position" in html and "PostgreSQL" in html
    finally:
        other.close()
        srv.stop()
