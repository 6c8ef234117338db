"""A local Ray instance is a head in a fresh interpreter that this process joins by address
(never `ray.init()` forking this one); a head that does not come up is tried once more;
other failures are not retried."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

raydata = pytest.importorskip("ragplane.server.bulk.raydata")
from ragplane.core.errors import Unavailable  # noqa: E402
from ragplane.server import ray_start  # noqa: E402


class FakeRay:
    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = failures or []
        self.inits: list[dict] = []
        self.shutdowns = 0

    def init(self, **options) -> None:
        self.inits.append(options)
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


class FakeHead:
    address = "127.0.0.1:6500"

    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


@pytest.fixture
def heads(monkeypatch):
    """start_head replaced: each call pops the next outcome (an exception or a head)."""
    outcomes: list = []
    started: list[dict] = []

    def start_head(options):
        started.append(options)
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(ray_start, "start_head", start_head)
    monkeypatch.setattr(ray_start, "_head", None)
    return outcomes, started


def test_a_local_start_joins_a_head_started_apart_and_stops_it_after(monkeypatch, heads):
    outcomes, started = heads
    head = FakeHead()
    outcomes.append(head)
    fake = FakeRay()
    monkeypatch.setattr(raydata, "ray", fake)
    raydata._init("local", {"num_cpus": 2, "object_store_memory": 1 << 20,
                            "include_dashboard": False, "log_to_driver": False})
    assert started == [{"num_cpus": 2, "object_store_memory": 1 << 20,
                        "include_dashboard": False}]
    # the instance's options went to the head; the driver only joins it
    assert fake.inits == [{"log_to_driver": False, "address": head.address}]
    ray_start.shutdown_ray(fake)
    assert (fake.shutdowns, head.stops) == (1, 1)


def test_a_head_that_does_not_come_up_is_tried_once_more(monkeypatch, heads):
    outcomes, started = heads
    outcomes += [Unavailable("the local Ray head did not start within 90 s"), FakeHead()]
    fake = FakeRay()
    monkeypatch.setattr(raydata, "ray", fake)
    raydata._init("local", {})
    assert (len(started), len(fake.inits)) == (2, 1)


def test_two_failed_heads_give_up_with_unavailable(monkeypatch, heads):
    outcomes, _ = heads
    outcomes += [Unavailable("exited: a"), Unavailable("exited: b")]
    fake = FakeRay()
    monkeypatch.setattr(raydata, "ray", fake)
    with pytest.raises(Unavailable, match="exited: b"):
        raydata._init("local", {})
    assert fake.inits == []


def test_a_failed_join_stops_the_head(monkeypatch, heads):
    outcomes, _ = heads
    head = FakeHead()
    outcomes.append(head)
    fake = FakeRay([Exception("bad option")])
    monkeypatch.setattr(raydata, "ray", fake)
    with pytest.raises(Unavailable, match="Ray did not start \\(local\\): bad option"):
        raydata._init("local", {})
    assert head.stops == 1 and ray_start._head is None


def test_remote_addresses_are_joined_once_and_not_retried(monkeypatch, heads):
    _, started = heads
    fake = FakeRay([Exception("Timed out waiting for file a")])
    monkeypatch.setattr(raydata, "ray", fake)
    with pytest.raises(Unavailable):
        raydata._init("10.0.0.5:6379", {"address": "10.0.0.5:6379"})
    assert len(fake.inits) == 1 and started == []


def test_the_head_is_a_fresh_interpreter_launched_without_preexec_fn(monkeypatch, tmp_path):
    """No Python code may run in a forked copy of this process (it holds gRPC threads):
    Popen without preexec_fn is vfork + exec; the head gets its own session."""
    calls: list[tuple[list[str], dict]] = []

    class Started:
        pid = 4242
        returncode = None

        def poll(self):
            return None

    def popen(argv, **kwargs):
        calls.append((argv, kwargs))
        Path(kwargs["stdout"].name).write_text("...\nThis command will now block forever\n")
        return Started()

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(ray_start.atexit, "register", lambda _fn: None)
    head = ray_start.start_head({"num_cpus": 2, "include_dashboard": False})
    argv, kwargs = calls[0]
    assert argv[0] == sys.executable and "preexec_fn" not in kwargs
    assert kwargs["start_new_session"] is True
    assert argv[4:7] == ["start", "--head", "--block"]
    assert "--num-cpus=2" in argv and "--include-dashboard=false" in argv
    assert head.address.startswith("127.0.0.1:")
    assert not head.log.exists()  # unlinked once the head runs: nothing left behind
