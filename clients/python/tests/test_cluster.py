"""The client against a cluster: one PostgreSQL and two ragplane servers on it (issue 26),
started by scripts/cluster_for_tests.py, or the one named by $RAGPLANE_CLUSTER (that
script's JSON line; scripts/test_clients.sh starts one for all three clients).

A list of targets spreads the calls over both servers (counted by each server's /metrics),
and a write's consistency_token, passed to a read, reaches the server: the write is read
on whichever server answers, and a token from elsewhere is refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest

from ragplane_client import AsyncClient, Client, Item

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster():
    shared = os.environ.get("RAGPLANE_CLUSTER")
    if shared:
        yield json.loads(shared)
        return
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "cluster_for_tests.py"), "--servers", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        pytest.fail(f"scripts/cluster_for_tests.py exited with {proc.returncode} (see stderr)")
    info = json.loads(line)
    if "skip" in info:
        proc.wait()
        pytest.skip(info["skip"])
    yield info
    proc.stdin.close()  # the script tears the cluster down
    proc.wait(timeout=60)
    proc.stdout.close()


def served(metrics_url: str, method: str) -> float:
    """RPCs of `method` a server has answered, from its Prometheus /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    pat = re.compile(r'^ragplane_requests_total\{[^}]*method="[^"]*' + method + r'"[^}]*\} (\S+)$')
    return sum(float(m.group(1)) for m in map(pat.match, text.splitlines()) if m)


def addrs(cluster) -> list[str]:
    return [s["addr"] for s in cluster["servers"]]


def create_everywhere(cluster, name: str) -> None:
    """Create a collection and wait for every server to have it: a write checks its
    collection against the server's own copy, so a write through another server right
    after the create could find none yet (NOT_FOUND); writes carry no token."""
    a, b = addrs(cluster)
    with Client(a) as on_a, Client(b) as on_b:
        token = on_a.create_collection(name).consistency_token
        assert token
        assert on_b.describe_collection(name, consistency_token=token).name == name


def test_a_list_of_targets_spreads_calls_over_both_servers(cluster):
    servers = cluster["servers"]
    assert len(servers) == 2
    before = [served(s["metrics"], "ListCollections") for s in servers]
    with Client(addrs(cluster), timeout=30) as c:
        for _ in range(10):
            c.list_collections()
    after = [served(s["metrics"], "ListCollections") for s in servers]
    per_server = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(per_server) == 10
    assert min(per_server) >= 3, f"calls per server: {per_server}"


def test_a_write_is_read_with_its_token_on_whichever_server_answers(cluster):
    a, b = addrs(cluster)
    name = f"py_cluster_{uuid.uuid4().hex[:8]}"
    with Client([a, b], timeout=30) as both, Client(a) as on_a, Client(b) as on_b:
        info = on_a.create_collection(name)
        assert info.consistency_token
        up = on_a.upsert(name, [Item("1", "the cat sat on the mat", metadata={"n": 1}),
                                Item("2", "stock markets fell sharply")])  # fmt: skip
        assert up.upserted == 2 and up.consistency_token
        assert on_a.last_consistency_token == up.consistency_token
        token = up.consistency_token
        # On the other server alone, and round-robin over both (each read on the next one).
        for c in (on_b, both, both):
            assert [it.id for it in c.get(name, ["1", "2"], consistency_token=token)] == ["1", "2"]
            hits = c.search(name, "the cat sat on the mat", top_k=1, consistency_token=token)
            assert hits.hits[0].id == "1"
            assert c.describe_collection(name, consistency_token=token).count == 2
            listed = c.list_collections(consistency_token=token)
            assert name in [x.name for x in listed]
        m = on_b.remember(f"ns-{name}", "the user prefers dark mode")
        assert m.consistency_token
        for c in (on_a, both, both):
            mems = c.recall(f"ns-{name}", "dark mode", consistency_token=m.consistency_token)
            assert [x.id for x in mems] == [m.id]
            page = c.list_memories(f"ns-{name}", consistency_token=m.consistency_token)
            assert [x.id for x in page.memories] == [m.id]
            assert [x.id for x in c.iter_memories(f"ns-{name}", consistency_token=token)] == [m.id]


def test_the_token_reaches_the_server(cluster):
    """A token this cluster never gave is refused by the server (INVALID_ARGUMENT): proof
    that every read sends it, on both servers."""
    name = f"py_token_{uuid.uuid4().hex[:8]}"
    with Client(addrs(cluster), timeout=30) as c:
        c.create_collection(name)
        reads = [
            lambda: c.get(name, ["1"], consistency_token="elsewhere.1"),
            lambda: c.search(name, "x", consistency_token="elsewhere.1"),
            lambda: c.describe_collection(name, consistency_token="elsewhere.1"),
            lambda: c.list_collections(consistency_token="elsewhere.1"),
            lambda: c.recall("ns", "x", consistency_token="elsewhere.1"),
            lambda: c.list_memories("ns", consistency_token="elsewhere.1"),
        ]
        for read in reads * 2:
            with pytest.raises(grpc.RpcError) as e:
                read()
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_async_client_passes_and_returns_the_token(cluster):
    name = f"py_async_{uuid.uuid4().hex[:8]}"
    create_everywhere(cluster, name)
    async with AsyncClient(addrs(cluster), timeout=30) as c:
        up = await c.upsert(name, [Item("1", "hello there")])
        assert up.consistency_token and c.last_consistency_token == up.consistency_token
        for _ in range(2):
            got = await c.get(name, ["1"], consistency_token=up.consistency_token)
            assert [it.id for it in got] == ["1"]
        with pytest.raises(grpc.RpcError) as e:
            await c.search(name, "hello", consistency_token="elsewhere.1")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
