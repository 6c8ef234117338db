"""bench.avx2_only: a command run through it sees a CPU without AVX-512, and nothing else
changes for it (a real fault still kills it, its own SIGSEGV handler still runs)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from bench import avx2_only

UNSUPPORTED = avx2_only.unsupported()
pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"bench.avx2_only: {UNSUPPORTED}")

# numpy dispatches at run time from CPUID, as ONNX Runtime's MLAS and embedder_rs do
FEATURES = (
    "from numpy._core._multiarray_umath import __cpu_features__ as f; import json; "
    "from bench import avx2_only; "
    "print(json.dumps({'avx2': f['AVX2'], 'fma': f['FMA3'], 'avx512f': f['AVX512F'], "
    "'answered': avx2_only.answered()}))"
)


def _run(code: str, *python_flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bench.avx2_only", sys.executable, *python_flags, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_a_command_sees_avx2_and_fma_but_no_avx512() -> None:
    plain = subprocess.run(
        [sys.executable, "-c", FEATURES], capture_output=True, text=True, check=True
    )
    assert json.loads(plain.stdout)["answered"] is None  # not loaded: nothing answered
    r = _run(FEATURES)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["avx2"] and seen["fma"]
    assert seen["avx512f"] is False
    assert seen["answered"] > 0  # numpy's CPUID went through the shim
    assert (
        "AVX2-only CPU emulated"
        in _run("from bench import avx2_only; print(avx2_only.describe())").stdout
    )


def test_another_fault_still_kills_and_reaches_the_programs_handler() -> None:
    crash = "import ctypes; ctypes.string_at(0)"
    r = _run(crash)
    assert r.returncode == 128 + signal.SIGSEGV
    # faulthandler installs its SIGSEGV handler after the shim's: it still gets the fault
    r = _run(crash, "-X", "faulthandler")
    assert r.returncode == 128 + signal.SIGSEGV
    assert "Segmentation fault" in r.stderr
