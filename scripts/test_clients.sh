#!/usr/bin/env bash
# Runs the client tests, each against a live ragplane server that the test starts from the
# Python virtualenv ($VENV, default .venv; `make install` creates it) on port 0 with the
# fake embedder: the Python client's (clients/python/tests, pytest from $VENV; one test
# pip-installs the client from PyPI into an empty virtualenv), then the Go and Rust smoke
# tests, and each client's cluster tests against one PostgreSQL and two servers on it that
# this script starts once for all three (scripts/cluster_for_tests.py, passed to them as
# RAGPLANE_CLUSTER; without PostgreSQL they are skipped, saying so).
# Exits non-zero if any fails or its toolchain is missing; SKIP_PYTHON_CLIENT=1,
# SKIP_GO_CLIENT=1 or SKIP_RUST_CLIENT=1 leaves one out, and SKIP_CLIENT_INSTALL_TEST=1
# only the PyPI install (offline), each saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
export VENV=${VENV:-.venv}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ ! -x "$VENV/bin/python" ]; then
  echo "test_clients.sh: no Python virtualenv at $VENV; run 'make install' first" >&2
  exit 1
fi

# The cluster: its script tears it down when fd 3 closes, i.e. when this script exits.
if [ -z "${RAGPLANE_CLUSTER:-}" ]; then
  cluster_dir=$(mktemp -d)
  mkfifo "$cluster_dir/stdin"
  "$VENV/bin/python" scripts/cluster_for_tests.py --servers 2 \
    <"$cluster_dir/stdin" >"$cluster_dir/cluster.json" &
  cluster_pid=$!
  exec 3>"$cluster_dir/stdin"
  trap 'exec 3>&-; wait "$cluster_pid" 2>/dev/null || true; rm -rf "$cluster_dir"' EXIT
  until [ "$(wc -l <"$cluster_dir/cluster.json")" -ge 1 ]; do
    if ! kill -0 "$cluster_pid" 2>/dev/null; then
      echo "test_clients.sh: scripts/cluster_for_tests.py failed to start the cluster" >&2
      exit 1
    fi
    sleep 0.2
  done
  cluster=$(head -n 1 "$cluster_dir/cluster.json")
  case "$cluster" in
    *'"skip"'*) echo "test_clients.sh: cluster tests skipped: $cluster" >&2 ;;
    *) export RAGPLANE_CLUSTER="$cluster" ;;
  esac
fi

need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "test_clients.sh: '$1' is not on PATH; install it, or set $2=1 to skip that client" >&2
  exit 1
}

if [ -n "${SKIP_PYTHON_CLIENT:-}" ]; then
  echo "test_clients.sh: SKIP_PYTHON_CLIENT is set; Python client not tested" >&2
else
  echo "== Python client (clients/python)"
  marks=()
  if [ -n "${SKIP_CLIENT_INSTALL_TEST:-}" ]; then
    echo "test_clients.sh: SKIP_CLIENT_INSTALL_TEST is set; the empty-venv install not tested" >&2
    marks=(-m "not network")
  fi
  "$VENV/bin/python" -m pytest clients/python/tests -q "${marks[@]}"
fi

if [ -n "${SKIP_GO_CLIENT:-}" ]; then
  echo "test_clients.sh: SKIP_GO_CLIENT is set; Go client not tested" >&2
else
  need go SKIP_GO_CLIENT
  echo "== Go client (clients/go)"
  (cd clients/go && go vet ./... && go test -count=1 ./...)
fi

if [ -n "${SKIP_RUST_CLIENT:-}" ]; then
  echo "test_clients.sh: SKIP_RUST_CLIENT is set; Rust client not tested" >&2
else
  need cargo SKIP_RUST_CLIENT
  echo "== Rust client (clients/rust)"
  (cd clients/rust && cargo test --locked)
fi
