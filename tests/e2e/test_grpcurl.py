"""grpcurl through server reflection: `list` names every service, and a real Embed call over
JSON returns what the Python stub gets. grpcurl is a Go tool that
`scripts/install_tools.sh` installs (pinned) into .tools/bin; a grpcurl on PATH also works."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ragplane.v1 import embed_pb2

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _grpcurl() -> str | None:
    local = ROOT / ".tools" / "bin" / "grpcurl"
    return str(local) if local.is_file() else shutil.which("grpcurl")


GRPCURL = _grpcurl()
requires_grpcurl = pytest.mark.skipif(
    GRPCURL is None,
    reason="grpcurl is not installed: run scripts/install_tools.sh (it installs the pinned "
    "grpcurl into .tools/bin) or put grpcurl on PATH",
)


def _declared_services() -> set[str]:
    from ragplane.v1 import (
        admin_pb2,
        embed_pb2,
        index_pb2,
        memory_pb2,
        search_pb2,
    )

    return {
        name
        for mod in (admin_pb2, embed_pb2, index_pb2, memory_pb2, search_pb2)
        for name in mod.DESCRIPTOR.services_by_name
    }


def grpcurl(*args: str) -> str:
    assert GRPCURL is not None
    r = subprocess.run(
        [GRPCURL, "-plaintext", "-max-time", "30", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"grpcurl {' '.join(args)} failed ({r.returncode}):\n{r.stderr}"
    return r.stdout


@requires_grpcurl
def test_list_and_describe_through_reflection(server):
    addr = f"127.0.0.1:{server.port}"
    services = set(grpcurl(addr, "list").split())
    assert {
        "ragplane.v1.EmbedService",
        "ragplane.v1.IndexService",
        "ragplane.v1.SearchService",
        "ragplane.v1.MemoryService",
        "grpc.health.v1.Health",
    } <= services, services
    # Every listed ragplane service is one the protos declare.
    declared = {f"ragplane.v1.{s}" for s in _declared_services()}
    # every declared service is served, and nothing else of ours
    assert {s for s in services if s.startswith("ragplane.")} == declared, services
    # Reflection serves full descriptors, so grpcurl can build requests from them.
    described = grpcurl(addr, "describe", "ragplane.v1.SearchService")
    assert "rpc Search ( .ragplane.v1.SearchRequest ) returns ( .ragplane.v1.SearchResponse )" in (
        described
    ), described


@requires_grpcurl
def test_embed_over_json_matches_the_python_stub(server):
    out = grpcurl(
        "-d",
        json.dumps({"texts": ["hello world", "hello"]}),
        f"127.0.0.1:{server.port}",
        "ragplane.v1.EmbedService/Embed",
    )
    r = json.loads(out)
    assert r["dim"] == 64 and r["embedder"] == "fake@1"
    # grpcurl prints proto field names (older releases printed lowerCamelCase JSON names).
    assert r.get("token_counts", r.get("tokenCounts")) == [4, 3]
    got = np.array([v["values"] for v in r["vectors"]], dtype=np.float32)
    assert got.shape == (2, 64)
    want = server.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["hello world", "hello"]))
    np.testing.assert_allclose(got, np.array([v.values for v in want.vectors]), atol=1e-6)
