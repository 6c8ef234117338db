#!/usr/bin/env bash
# Installs everything ragplane needs into $VENV: system packages (a software Vulkan for
# embedder_rs's wgpu backend, PostgreSQL's server), the Rust toolchain check, the service
# with pinned versions, and embedder_rs built from source by maturin.
#
# The three are slow in different ways and run side by side: the system packages and the
# Python packages mostly wait on downloads and disks (a fresh machine's pip install left
# about half of 2 cores idle for ~4 minutes), the Rust build keeps the cores busy. embedder_rs is
# built into a wheel beside them and installed (without dependencies: numpy, its only one,
# comes with the service) once both are done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo (Rust) is needed to build embedder_rs; install it from https://rustup.rs" >&2
  exit 1
fi
work=$(mktemp -d)
# on the way out (an error above too): no build left running, nothing left behind
cleanup() {
  local running
  running=$(jobs -p)
  [ -z "$running" ] || kill $running 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

(
  bash scripts/install_vulkan.sh || echo "note: software Vulkan not installed; wgpu tests will skip"
  bash scripts/install_postgres.sh
  bash scripts/install_browser.sh
) >"$work/system.log" 2>&1 &
system=$!

"$PY" -m pip install -q --upgrade pip
"$PY" -m pip wheel -q --no-deps -w "$work/wheel" ./embedder_rs >"$work/rust.log" 2>&1 &
rust=$!

"$PY" -m pip install -q -c constraints.txt -e ".[dev]"

wait "$system" || true  # both scripts say why they installed nothing, and go on
cat "$work/system.log"
if ! wait "$rust"; then
  cat "$work/rust.log" >&2
  echo "error: building embedder_rs failed (the cargo output is above)" >&2
  exit 1
fi
"$PY" -m pip install -q --no-deps --force-reinstall "$work"/wheel/embedder_rs-*.whl
"$PY" -c "import embedder_rs, ragplane.server, ragplane.index, ragplane.v1; print('installed: embedder_rs', embedder_rs.__version__)"
