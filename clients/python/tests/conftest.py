"""Fixtures: a real ragplane server (in this process, port 0, the fake embedder: dim 64,
tokens are whitespace words + 2) and clients dialling it.

These tests run from the server's virtualenv, where `ragplane.testkit` is installed;
`ragplane_client` is imported from this directory (pytest's `pythonpath`), so no install is
needed. `scripts/test_clients.sh` (and so `make test`) runs them."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def server(tmp_path):
    from ragplane.testkit.harness import InProcessServer

    srv = InProcessServer(tmp_path / "data")
    yield srv
    srv.stop()


@pytest.fixture
def target(server) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def client(target):
    from ragplane_client import Client

    with Client(target, timeout=30) as c:
        yield c
