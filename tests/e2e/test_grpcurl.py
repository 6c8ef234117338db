"""grpcurl through server reflection: `list` names every service, a real Embed call over
JSON returns what the Python stub gets, and the README's grpcurl snippets run as written
(twice, with the same output). grpcurl is a Go tool that `scripts/install_tools.sh`
installs (pinned) into .tools/bin; a grpcurl on PATH also works."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragplane.v1 import common_pb2, embed_pb2, index_pb2

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


def _readme_commands(heading: str) -> list[list[str]]:
    """The grpcurl commands of the first ```sh block after `heading` in README.md, as argv
    lists (continuation lines joined)."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(heading) :].split("```sh\n", 1)[1].split("```", 1)[0]
    commands: list[list[str]] = []
    for word in shlex.split(block.replace("\\\n", " ")):  # quoted JSON may span lines
        if word == "grpcurl":
            commands.append([])
        commands[-1].append(word)
    return commands


def _field(d: dict, name: str):
    camel = name.split("_")[0] + "".join(p.title() for p in name.split("_")[1:])
    return d.get(name, d.get(camel))


@requires_grpcurl
def test_hybrid_search_as_the_readme_shows(server):
    """Runs the README's lexical/hybrid grpcurl commands verbatim, but for the port."""
    addr = f"127.0.0.1:{server.port}"
    setup = common_pb2.Item(id="1", text="SQLite is the source of truth")
    server.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"))
    server.stubs.index.Upsert(index_pb2.UpsertRequest(collection="docs", items=[setup]))
    outs = []
    for argv in _readme_commands("### Lexical and hybrid search"):
        assert argv[:2] == ["grpcurl", "-plaintext"], argv
        outs.append(json.loads(grpcurl(*[addr if a == "127.0.0.1:50051" else a for a in argv[2:]])))
    upsert, lexical, hybrid, weighted = outs
    assert int(upsert["upserted"]) == 1
    assert [h["id"] for h in lexical["hits"]] == ["2"]
    assert _field(lexical["hits"][0], "lexical_score") > 0
    assert _field(lexical["hits"][0], "dense_score") is None
    assert hybrid["hits"][0]["id"] == "2" and len(hybrid["hits"]) == 2
    for h in hybrid["hits"] + weighted["hits"]:
        assert _field(h, "fused_score") is not None and _field(h, "dense_score") is not None


def _readme_shell_blocks() -> list[str]:
    """Every ```sh block of README.md that calls grpcurl, in the README's order (the later
    ones use the collection the first creates)."""
    text = (ROOT / "README.md").read_text()
    return [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "grpcurl" in b]


def _replies(out: str) -> list:
    """grpcurl's output as its replies: each JSON object parsed, other lines (`list`) kept."""
    dec, got, i = json.JSONDecoder(), [], 0
    while i < len(out):
        if out[i].isspace():
            i += 1
        elif out[i] == "{":
            obj, i = dec.raw_decode(out, i)
            got.append(obj)
        else:
            end = out.find("\n", i)
            end = len(out) if end < 0 else end
            got.append(out[i:end])
            i = end
    return got


def _pop_token(reply: dict) -> str | None:
    token = None
    for key in ("consistency_token", "consistencyToken"):
        token = reply.pop(key, None) or token
    return token


def _position(token: str) -> int:
    return int(token.rsplit(".", 1)[1])


@requires_grpcurl
def test_every_grpcurl_snippet_runs_twice_with_the_same_output(server):
    """Each of the README's grpcurl blocks runs verbatim in bash (but for the port) twice in
    a row against one server, in the README's order: no ALREADY_EXISTS (CreateCollection
    asks exist_ok), no duplicate items, the same replies. A CreateCollection reply describes
    the collection as it is, so only its counters differ: the items its block wrote once."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(GRPCURL).parent), str(Path(sys.executable).parent),
                                   env["PATH"]])
    blocks = [b.replace("127.0.0.1:50051", f"127.0.0.1:{server.port}")
              for b in _readme_shell_blocks()]
    assert len(blocks) >= 3, "the README's grpcurl blocks moved"
    counts: dict[str, tuple] = {}
    for block in blocks:
        first, second = (_run_block(block, env) for _ in range(2))
        assert len(first) == len(second), block
        for a, b in zip(first, second, strict=True):
            if isinstance(a, dict) and isinstance(b, dict):
                # a PostgreSQL store's replies name the position they reflect: later the
                # second time (the embedded store sends none)
                ta, tb = (_pop_token(x) for x in (a, b))
                assert (ta is None) == (tb is None), block
                if ta is not None:
                    assert _position(tb) >= _position(ta), (ta, tb)
            if isinstance(a, dict) and _field(a, "created_at"):  # a CreateCollection reply
                counts[a["name"]] = (a.pop("count", "0"), b.pop("count"), b.pop("chunks"))
                a.pop("chunks", None)
            assert a == b, block
    # created empty the first time, found holding the block's one document the second
    assert counts == {"docs": ("0", "1", "1"), "manual": ("0", "1", counts["manual"][2])}
    assert int(counts["manual"][2]) > 1  # the manual's section, chunked


def _run_block(block: str, env: dict[str, str]) -> list:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, f"README block failed ({r.returncode}):\n{block}\n{r.stderr}"
    return _replies(r.stdout)
