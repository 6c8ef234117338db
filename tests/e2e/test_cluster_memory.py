"""Agent memory on a cluster: the first Remember into a new namespace, sent through two
servers at once, makes one namespace and keeps both memories (it answered ALREADY_EXISTS
on one server: each saw no namespace, both made one, PostgreSQL kept the first)."""

from __future__ import annotations

import threading

import grpc
import pytest

from ragplane.testkit.harness import SubprocessServer
from ragplane.testkit.postgres import available
from ragplane.v1 import memory_pb2
from tests.e2e.cluster_load import servers_on

pytestmark = pytest.mark.skipif(
    not available(),
    reason="PostgreSQL's server binaries are not installed (apt install postgresql)",
)


@pytest.fixture
def pair(pg, tmp_path):
    with servers_on(pg.create_database("c_memory_race"), tmp_path, 2) as servers:
        yield servers


def test_first_memories_of_a_new_namespace_through_two_servers_at_once_are_both_kept(pair):
    namespaces = [f"agent-{i}" for i in range(12)]
    errors: list[str] = []
    kept: dict[tuple[str, int], tuple[str, str]] = {}

    def remember(server: SubprocessServer, who: int, gate: threading.Barrier) -> None:
        for ns in namespaces:
            gate.wait(timeout=30)  # both servers see no namespace yet
            try:
                r = server.stubs.memory.Remember(
                    memory_pb2.RememberRequest(
                        namespace=ns, text=f"server {who} was told about {ns}", ttl_seconds=0
                    ),
                    timeout=10,
                )
                kept[(ns, who)] = (r.id, r.consistency_token)
            except grpc.RpcError as e:
                errors.append(f"{ns} via server {who}: {e.code().name} {e.details()}")

    gate = threading.Barrier(2)
    threads = [threading.Thread(target=remember, args=(s, i, gate)) for i, s in enumerate(pair)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for ns in namespaces:
        want = {kept[(ns, 0)][0], kept[(ns, 1)][0]}
        for server in pair:
            for _, token in (kept[(ns, 0)], kept[(ns, 1)]):  # each write applied here
                got = server.stubs.memory.Recall(
                    memory_pb2.RecallRequest(
                        namespace=ns, query=f"told about {ns}", top_k=5, consistency_token=token
                    ),
                    timeout=10,
                )
            assert want <= {m.id for m in got.memories}, (ns, want, got)
