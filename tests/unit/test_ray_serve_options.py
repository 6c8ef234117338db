"""The Ray Serve backend's settings and address checks, without starting Ray."""

from __future__ import annotations

import socket

import pytest

from ragplane.core.errors import InvalidArgument, Unavailable
from ragplane.server.embedding.ray_serve import _check_reachable
from ragplane.server.settings import Settings


def test_in_process_is_the_default():
    s = Settings.from_mapping({})
    assert s.embed_backend == "in_process" and s.ray_address == ""


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"embed_backend": "ray"}, "use in_process or ray_serve"),
        ({"ray_serve_min_replicas": 3, "ray_serve_max_replicas": 2}, "ray_serve_min_replicas <="),
        ({"ray_serve_max_replicas": 0, "ray_serve_min_replicas": 0}, "max_replicas >= 1"),
        ({"ray_serve_replica_cpus": 0}, "ray_serve_replica_cpus >= 1"),
        ({"ray_address": "head node:6379"}, "is not valid"),
    ],
)
def test_bad_values_are_refused_with_the_way_out(values, message):
    with pytest.raises(InvalidArgument, match=message):
        Settings.from_mapping({"embed_backend": "ray_serve", **values})


def test_an_address_that_is_not_one_is_named():
    with pytest.raises(Unavailable, match="'head' is not an address; use host:port"):
        _check_reachable("head")


def test_a_closed_port_fails_fast_with_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens
    with pytest.raises(Unavailable, match=f"cannot reach Ray at ray://127.0.0.1:{port}") as e:
        _check_reachable(f"ray://127.0.0.1:{port}")
    assert "ray_address=local" in str(e.value) and "embed_backend=in_process" in str(e.value)
