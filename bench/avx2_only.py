"""`python -m bench.avx2_only CMD ...`: run CMD as on an x86-64 CPU without AVX-512.

Users run the service on CPUs with AVX2 + FMA and no AVX-512 (AMD Zen 2/3, many cloud VMs),
and the machine at hand may have AVX-512. `EMBEDDER_RS_KERNEL=avx2` narrows embedder_rs
alone; ONNX Runtime's MLAS chooses its kernels from CPUID and no setting narrows it, so
that comparison pits AVX2 against AVX-512. This narrows both: `avx2_only.c`, compiled here
with the system's C compiler and preloaded, turns on Linux's CPUID faulting and answers
every CPUID instruction as the CPU would with AVX-512, AMX and AVX-VNNI cleared. Every
library that dispatches at run time (MLAS, embedder_rs and its gemm, numpy) then takes its
AVX2 + FMA path. Child processes inherit it (LD_PRELOAD), so a server the command starts
runs the same way. What stays this CPU's own: its caches, clocks and FMA units, and
/proc/cpuinfo's flags.

Needs Linux on x86-64 with the `cpuid_fault` flag (Intel since Ivy Bridge, and VMs on it).

    python -m bench.avx2_only python -m bench.rust --no-torch
    python -m bench.avx2_only python -m bench.service_g2
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ragplane.server.shadow.hardware import cpu_info

SOURCE = Path(__file__).with_suffix(".c")


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def unsupported() -> str | None:
    """Why this machine cannot run a command this way, or None."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"needs Linux on x86-64 (this is {sys.platform} {platform.machine()})"
    if "cpuid_fault" not in cpu_info()[1]:
        return "the CPU (or its hypervisor) offers no CPUID faulting (no cpuid_fault flag)"
    if not _compiler():
        return "no C compiler (cc) to build the CPUID shim"
    return None


def library() -> Path:
    """The shim, compiled once per version of its source into the temporary folder."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"ragplane-avx2-only-{digest}.so"
    if not out.exists():
        cc = _compiler() or "cc"
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl"], check=True
        )
        tmp.replace(out)
    return out


def answered() -> int | None:
    """CPUID instructions the shim has answered in this process, or None when the process
    does not run with it."""
    process = ctypes.CDLL(None)
    try:
        fn, active = process.ragplane_avx2_only_answered, process.ragplane_avx2_only_active
    except AttributeError:
        return None
    fn.restype = ctypes.c_uint64
    return int(fn()) if active() else None


def describe() -> str:
    """One line for a benchmark's report: whether, and how, AVX-512 is hidden."""
    n = answered()
    if n is None:
        return ""
    return (
        "AVX2-only CPU emulated (bench.avx2_only: CPUID answered without AVX-512, AMX and "
        f"AVX-VNNI, {n} CPUID instructions so far; every library's kernels are its AVX2 + "
        "FMA ones)"
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    why = unsupported()
    if why:
        print(f"bench.avx2_only: cannot hide AVX-512 here: {why}", file=sys.stderr)
        return 2
    lib = str(library())
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    rc = subprocess.call(argv, env=env)
    return 128 - rc if rc < 0 else rc  # killed by a signal: as a shell reports it


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
