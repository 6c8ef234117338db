#!/usr/bin/env bash
# embedder_rs's unit tests built for aarch64 and run under QEMU's user-mode emulation:
# there the host kernels choose the NEON tile at run time, the tests hold it to the scalar
# reference bit for bit (model::cpu::packed) and the whole host pass to burn's forward
# pass (model::cpu). Correctness only: an emulated core's speed says nothing about an ARM
# one, so nothing here is timed.
#
# Needs rustup's aarch64 standard library and three Debian packages:
#   rustup target add aarch64-unknown-linux-gnu
#   apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
# Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/../embedder_rs"
TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

missing=()
rustup target list --installed 2>/dev/null | grep -qx "$TARGET" ||
  missing+=("rustup target add $TARGET")
command -v aarch64-linux-gnu-gcc >/dev/null ||
  missing+=("apt-get install gcc-aarch64-linux-gnu")
[ -d "$SYSROOT/lib" ] || missing+=("apt-get install libc6-dev-arm64-cross")
command -v qemu-aarch64 >/dev/null || missing+=("apt-get install qemu-user")
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-neon: cannot cross-test; missing:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  exit 1
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
# pyo3 is built (never linked: the tests leave the `python` feature off), and its build
# script needs a Python version to configure for when it cannot run the target's Python
export PYO3_CROSS_PYTHON_VERSION=${PYO3_CROSS_PYTHON_VERSION:-3.11}
# a target directory of its own: cargo locks the one it builds in for the whole build,
# and the x86 builds (maturin's, cargo test's) must not wait on this one
export CARGO_TARGET_DIR=${NEON_TARGET_DIR:-target/neon}
# the kernel the process chose is what it reports; forcing one is for x86 comparisons
unset EMBEDDER_RS_KERNEL
cargo test --release --target "$TARGET" --lib "$@"
