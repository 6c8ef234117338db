"""A local Ray start that times out is tried once more; other failures are not retried."""

from __future__ import annotations

import pytest

raydata = pytest.importorskip("ragplane.server.bulk.raydata")
from ragplane.core.errors import Unavailable  # noqa: E402


class FakeRay:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.inits = 0
        self.shutdowns = 0

    def init(self, **_options) -> None:
        self.inits += 1
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.mark.parametrize(
    "message",
    [
        "The current node timed out during startup.",
        "Timed out waiting for file session_x/gcs_server_port_abc",
    ],
)
def test_a_local_start_that_times_out_is_tried_once_more(monkeypatch, message):
    fake = FakeRay([Exception(message)])
    monkeypatch.setattr(raydata, "ray", fake)
    raydata._init("local", {})
    assert (fake.inits, fake.shutdowns) == (2, 1)


def test_two_timeouts_give_up_with_unavailable(monkeypatch):
    fake = FakeRay([Exception("Timed out waiting for file a"), Exception("timed out again")])
    monkeypatch.setattr(raydata, "ray", fake)
    with pytest.raises(Unavailable, match="Ray did not start \\(local\\)"):
        raydata._init("local", {})
    assert fake.inits == 2


def test_other_failures_and_remote_addresses_are_not_retried(monkeypatch):
    fake = FakeRay([Exception("bad option")])
    monkeypatch.setattr(raydata, "ray", fake)
    with pytest.raises(Unavailable, match="bad option"):
        raydata._init("local", {})
    fake = FakeRay([Exception("Timed out waiting for file a")])
    monkeypatch.setattr(raydata, "ray", fake)
    with pytest.raises(Unavailable):
        raydata._init("10.0.0.5:6379", {"address": "10.0.0.5:6379"})
    assert fake.inits == 1
