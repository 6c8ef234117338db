"""`python -m bench.flip` (make flip-demo) on the real model: it flips and shows every
step, or names the gate that holds the flip back with its numbers and exits 3."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ragplane.testkit.harness import ROOT
from tests.native import require_embedder_rs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def test_flip_demo_flips_or_names_the_gate():
    require_embedder_rs()
    out = subprocess.run(
        [sys.executable, "-m", "bench.flip", "--timeout", "600"],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
    )
    text = out.stdout + out.stderr
    assert out.returncode in (0, 3), text
    assert "DEMO SETTING: evidence minimums lowered" in text
    assert "passages embedded by onnx@" in text
    if out.returncode == 3:
        held = text.split("flip held back by ", 1)[1].split()[0:3]
        assert any(g.startswith("G") for g in held), text
        assert "FAIL --" in text and "upper95=" in text  # the gate, with its numbers
    else:
        assert "flipped by itself" in text and "4 of 4 passages find themselves" in text
        assert "new vectors come from embedder_rs@" in text and ": ok" in text
        assert "onnx@" in text.split("after `ragplane shadow unflip", 1)[1]
