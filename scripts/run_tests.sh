#!/usr/bin/env bash
# Runs the Python tests, then cargo's for embedder_rs. pytest's exit code 5 ("no tests
# collected", e.g. a marker subset that selects nothing) is reported, not failed.
#
# Here the build and the model are expected, so nothing that needs them may skip quietly:
# RAGPLANE_REQUIRE_EMBEDDER_RS=1 makes a missing or broken embedder_rs fail the Python tests
# that need it (tests/native.py), and cargo's real-model test runs on the model the Python
# side loads (EMBEDDER_RS_MODEL_DIR, EMBEDDER_RS_REQUIRE_MODEL=1) with its result shown.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAGPLANE_REQUIRE_EMBEDDER_RS=${RAGPLANE_REQUIRE_EMBEDDER_RS:-1}
"$VENV/bin/python" -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "warning: pytest collected no tests for: $*" >&2
  rc=0
fi
[ $rc -eq 0 ] || exit $rc
if [ -f embedder_rs/Cargo.toml ] && [ -z "${SKIP_CARGO_TEST:-}" ]; then
  if [ -z "${EMBEDDER_RS_MODEL_DIR:-}" ]; then
    EMBEDDER_RS_MODEL_DIR=$("$VENV/bin/python" -c \
      'from ragplane.server.embedding.model_files import default_model_dir; print(default_model_dir())') \
      || { echo "error: no model directory for embedder_rs's real-model test" >&2; exit 1; }
  fi
  export EMBEDDER_RS_MODEL_DIR EMBEDDER_RS_REQUIRE_MODEL=1
  real=embeds_with_the_real_model_on_cpu  # embedder_rs/tests/model_dir.rs
  (cd embedder_rs && cargo test --release --quiet -- --skip "$real") || exit $?
  # Not quiet, its output shown: the log says that the real-model test ran, and on what.
  (cd embedder_rs && cargo test --release --test model_dir -- --show-output "$real") || exit $?
fi
