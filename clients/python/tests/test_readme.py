"""The README's Python quick starts, run as written (but for the address) twice in a row
against one server: a second run must print what the first printed (no ALREADY_EXISTS, no
duplicates), and the Python client's first printed line must be the README's sample line
(but for the embedder's name).

Each snippet is the first ```python block under its heading in the repository's README.md.
The server runs the fake embedder, so the scores differ from the README's (real model)."""

from __future__ import annotations

import contextlib
import io
import re
import socket
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"
ADDRESS = re.compile(r"127\.0\.0\.1:(5005[0-9]|8080)")


def snippet(heading: str, fence: str = "```python\n") -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index(heading):].split(fence, 1)[1].split("```", 1)[0]


def run_twice(code: str, grpc_target: str, http_target: str = "") -> tuple[str, str]:
    def address(m: re.Match) -> str:
        return http_target if m[1] == "8080" else grpc_target

    code = ADDRESS.sub(address, code)
    outs = []
    for _ in range(2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102
        outs.append(out.getvalue())
    assert outs[0].strip(), "the snippet printed nothing"
    return outs[0], outs[1]


def test_use_it_with_the_generated_stubs_and_agent_memory(target):
    code = snippet("## Use it") + snippet("## Agent memory")
    first, second = run_twice(code, target)
    assert first == second
    assert "The user prefers dark mode" in first


def test_the_python_client_quick_start_and_its_sample_output(target):
    first, second = run_twice(snippet("### Python client\n"), target)
    assert first == second
    sample = snippet("From a virtualenv holding only the client", "```\n").splitlines()
    assert first.splitlines()[0] == sample[0].replace("'onnx@1.32.0'", "'fake@1'")
    assert first.splitlines()[-1] == sample[-1]  # the filtered search: ['1']


def test_the_langchain_quick_start(target):
    pytest.importorskip("langchain_core")
    first, second = run_twice(snippet("### LangChain"), target)
    assert first == second and first.count("\n") >= 3


def test_the_llama_index_quick_start(target):
    pytest.importorskip("llama_index.core")
    first, second = run_twice(snippet("### LlamaIndex"), target)
    assert first == second
    assert len(first.splitlines()) == 2  # two documents, not four after the second run


def test_the_cluster_quick_start_on_one_server(target):
    first, second = run_twice(snippet("## A cluster"), target)  # three targets, one server
    assert first == second and "n1" in first


def test_the_openai_quick_start(tmp_path):
    pytest.importorskip("openai")
    from ragplane.testkit.harness import InProcessServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = InProcessServer(tmp_path / "data", http_port=port)
    try:
        code = snippet("### OpenAI-compatible embeddings over HTTP")
        first, second = run_twice(code, f"127.0.0.1:{srv.port}",
                                  f"127.0.0.1:{srv.runtime.http.port}")
    finally:
        srv.stop()
    assert first == second and first.split()[1:3] == ["2", "64"]
