#!/usr/bin/env bash
# Installs everything ragplane needs into $VENV: system packages (a software Vulkan for
# embedder_rs's wgpu backend), the Rust toolchain check, the service with pinned
# versions, and embedder_rs built from source by maturin.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

if [ -x scripts/install_vulkan.sh ] || [ -f scripts/install_vulkan.sh ]; then
  bash scripts/install_vulkan.sh || echo "note: software Vulkan not installed; wgpu tests will skip"
fi
bash scripts/install_postgres.sh
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo (Rust) is needed to build embedder_rs; install it from https://rustup.rs" >&2
  exit 1
fi

"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q -c constraints.txt -e ".[dev]"
"$PY" -m pip install -q -c constraints.txt ./embedder_rs
"$PY" -c "import embedder_rs, ragplane.server, ragplane.index, ragplane.v1; print('installed: embedder_rs', embedder_rs.__version__)"
