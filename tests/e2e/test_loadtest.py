"""CI smoke run of the Locust load tests: the mixed scenario for about 20 seconds against a
real server (fake embedder) must fail no call and exercise every scenario's RPCs.

The load test runs in a subprocess (`python -m loadtest ... --json-out FILE`) because
importing Locust monkey-patches the interpreter with gevent, which must never happen inside
the pytest process that runs the other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ragplane.testkit.harness import ROOT, SubprocessServer

pytestmark = pytest.mark.e2e

RUN_TIME_S = 20
# The RPCs each scenario drives (loadtest/scenarios.py); the mixed scenario drives them all.
SCENARIO_RPCS = {
    "embed-heavy": {"EmbedService/Embed", "EmbedService/EmbedStream", "EmbedService/Info"},
    "search-heavy": {"SearchService/Search"},
    "ingest": {"IndexService/Upsert", "IndexService/Get", "IndexService/Delete"},
    "memory": {
        "MemoryService/Remember",
        "MemoryService/Recall",
        "MemoryService/ListMemories",
        "MemoryService/Forget",
    },
}


@pytest.fixture
def server(tmp_path):
    srv = SubprocessServer(tmp_path / "data")
    srv.start()
    yield srv
    srv.terminate()


def test_mixed_scenario_smoke(server, tmp_path):
    out = tmp_path / "summary.json"
    cmd = [
        sys.executable, "-m", "loadtest",
        "--scenario", "mixed",
        "--users", "8", "--spawn-rate", "8",
        "--run-time", f"{RUN_TIME_S}s",
        "--seed-items", "300",
        "--host", f"127.0.0.1:{server.port}",
        "--json-out", str(out),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAGPLANE_API_KEY"}  # server has no keys
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - t0
    report = (
        f"rc={proc.returncode} after {elapsed:.0f}s\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    assert out.exists(), report
    summary = json.loads(out.read_text())

    assert summary["failures"] == [], report
    assert summary["user_errors"] == [], report
    assert summary["total"]["failures"] == 0, report
    assert summary["ok"] and proc.returncode == 0, report
    assert RUN_TIME_S <= summary["duration_s"] < RUN_TIME_S + 30, report

    seen = {r["name"]: r["requests"] for r in summary["rpcs"]}
    for scenario, rpcs in SCENARIO_RPCS.items():
        missing = {rpc for rpc in rpcs if seen.get(rpc, 0) <= 0}
        assert not missing, f"{scenario}: no requests for {sorted(missing)}\n{report}"
    for r in summary["rpcs"]:
        assert r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"], r


def test_the_default_load_is_the_real_model_and_the_fake_is_a_flag():
    """`make loadtest` starts the server with the embedder `ragplane serve` would use; the
    fake is opt-in (`--fake-embedder`). Checked in a subprocess: Locust patches on import."""
    code = (
        "from loadtest.cli import build_parser as b; p = b(); "
        "print(p.parse_args(['--start-server']).embedder, "
        "p.parse_args(['--start-server', '--fake-embedder']).embedder)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["auto", "fake"]
