"""The hardware class a shadow decision is made on.

A release's speed is evidence only on hardware like the one it was measured on: a shadow
that beats ONNX Runtime with AVX-512 may lose with AVX2 alone, and one measured on CPUs
says nothing of a CUDA canonical. So evidence and recorded releases carry the class, and
G3 counts only releases measured on the class of the decision at hand:

  * "gpu <model>" when either embedder runs on a GPU (CUDA device name, or the wgpu
    adapter of a real GPU);
  * "cpu <arch> <vector extension>" otherwise: the widest kernel the shadow chose
    (embedder_rs names it; `EMBEDDER_RS_KERNEL` can force a narrower one), else the widest
    the CPU has (avx512, avx2, neon, or portable).
"""

from __future__ import annotations

import functools
import platform
import sys
from pathlib import Path
from typing import Any


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """The processor's model name and feature flags from /proc/cpuinfo (x86 "model name"
    and "flags", Arm "CPU model" and "Features"); ("", {}) where there is none."""
    model, flags = "", frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def cpu_model() -> str:
    return cpu_info()[0]


def cpu_extension(
    flags: set[str] | frozenset[str] | None = None, machine: str | None = None
) -> str:
    """The widest vector extension the CPU offers to an fp32 kernel."""
    flags = cpu_info()[1] if flags is None else flags
    machine = machine or platform.machine()
    if machine in ("aarch64", "arm64"):
        return "neon"
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "portable"


def _cuda_name(device: str) -> str:
    torch = sys.modules.get("torch")  # never import torch just to name the device
    try:
        if torch is not None and torch.cuda.is_available():
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            return str(torch.cuda.get_device_name(index))
    except (AttributeError, RuntimeError, ValueError):
        pass
    return device


def hardware_class(canonical: Any, shadow: Any) -> str:
    """The class of the machine on which `canonical` and `shadow` (Embedders) are
    compared."""
    for e in (canonical, shadow):
        device = str(getattr(e, "device", "") or "")
        if device.startswith("cuda"):
            return f"gpu {_cuda_name(device)}"
        if device.startswith("wgpu:") and "cpu" not in device.lower():
            return f"gpu {device.removeprefix('wgpu:')}"
    kernel = str(getattr(shadow, "kernel", "") or "")
    if kernel in ("", "wgpu"):
        kernel = cpu_extension()
    return f"cpu {platform.machine()} {kernel}"
