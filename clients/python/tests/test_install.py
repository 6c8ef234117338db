"""The distribution stands alone: in an empty virtualenv, `pip install ./clients/python`
brings grpcio and protobuf (and their own dependencies) and nothing of the server's
stack (torch, ray, faiss, onnxruntime, numpy), and the installed client, with no
`ragplane` importable, talks to a real server this test starts.

It installs from PyPI (pip's cache makes a re-run take seconds): `-m "not network"` leaves
it out where there is no index to reach.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.network

PACKAGE = Path(__file__).resolve().parents[1]  # clients/python
HEAVY = ("torch", "ray", "faiss", "onnxruntime", "numpy", "sentence-transformers", "nvidia-")
ALLOWED = {"pip", "setuptools", "wheel", "grpcio", "protobuf", "typing-extensions"}

SCRIPT = """
import asyncio, importlib.resources, importlib.util, json, sys
assert importlib.util.find_spec("ragplane") is None, "the server package is importable"
from ragplane_client import AsyncClient, Client, filters as f

pkg = importlib.resources.files("ragplane_client")
assert pkg.joinpath("py.typed").is_file() and pkg.joinpath("v1/index_pb2.pyi").is_file()

with Client(sys.argv[1]) as c:
    c.create_collection("docs", chunking={"max_tokens": 64})
    up = c.upsert("docs", [
        {"id": "1", "text": "sqlite is the source of truth", "metadata": {"year": 2024}},
        {"id": "2", "text": "faiss indexes are derived", "metadata": {"year": 2019}},
    ])
    hits = c.search("docs", "where is the source of truth", top_k=2, mode="hybrid",
                    filter=f.where(f.gte("year", 2020)))
    mem = c.remember("agent", "the user prefers dark mode")
    recalled = c.recall("agent", "dark mode", top_k=1)

async def aio():
    async with AsyncClient(sys.argv[1]) as c:
        return (await c.embed(["hello world"])).dim

print(json.dumps({
    "upserted": up.upserted, "hits": [(h.id, h.metadata, h.fused_score is not None) for h in hits],
    "recalled": [m.id for m in recalled] == [mem.id], "dim": asyncio.run(aio()),
    "modules": sorted(m.split(".")[0] for m in sys.modules if not m.startswith("_")),
}))
"""


def _run(cmd: list[str], cwd: Path, timeout: float = 240) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.timeout(600)
def test_pip_install_into_an_empty_venv_brings_no_server_stack_and_talks_to_a_server(
    tmp_path, target
):
    # A copy, so the build writes nothing into the repository (and nothing outside
    # clients/python can be needed).
    src = tmp_path / "src"
    shutil.copytree(
        PACKAGE,
        src,
        ignore=shutil.ignore_patterns(
            "__pycache__", "build", "*.egg-info", ".pytest_cache", ".ruff_cache", "tests"
        ),
    )
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, timeout=120)
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", str(src)], tmp_path)
    listing = json.loads(_run([py, "-m", "pip", "list", "--format=json"], tmp_path))
    names = sorted(p["name"].lower().replace("_", "-") for p in listing)
    print("the empty venv after `pip install ./clients/python`:", names)
    assert not [n for n in names if n.startswith(HEAVY) or n == "ragplane"], names
    assert {"grpcio", "protobuf", "ragplane-client"} <= set(names)
    assert set(names) - {"ragplane-client"} <= ALLOWED, names
    (tmp_path / "use.py").write_text(SCRIPT)
    result = json.loads(_run([py, str(tmp_path / "use.py"), target], tmp_path, timeout=60))
    assert result["upserted"] == 2 and result["dim"] == 64 and result["recalled"]
    assert result["hits"] == [["1", {"year": 2024}, True]]
    assert not set(result["modules"]) & {"numpy", "torch", "ray", "faiss", "ragplane"}
