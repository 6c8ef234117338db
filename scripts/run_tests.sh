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

# A full run (no arguments) runs the whole e2e suite once more, every server on a PostgreSQL
# store (one PostgreSQL for the run, a database per test server: ragplane.testkit.harness),
# in the background beside cargo's tests. test_cluster*.py start their own PostgreSQL (they stop
# it) and ran above; every other module runs again here. SKIP_POSTGRES=1 leaves the pass out,
# saying so.
pg_pid=""
pg_dir=""
if [ $# -eq 0 ] && [ -n "${SKIP_POSTGRES:-}" ]; then
  echo "run_tests.sh: SKIP_POSTGRES is set; the e2e suite did not run on a PostgreSQL store" >&2
elif [ $# -eq 0 ]; then
  pg_dir=$(mktemp -d /tmp/ragplane-test-pg.XXXXXX)
  chmod 755 "$pg_dir"
  pg_url=$("$VENV/bin/python" scripts/postgres_for_tests.py start "$pg_dir") || exit 1
  echo "== the e2e suite on a PostgreSQL store (in the background; log: $pg_dir/e2e.log)"
  RAGPLANE_TEST_PG="$pg_url" "$VENV/bin/python" -m pytest tests/e2e -p no:cacheprovider \
    --ignore tests/e2e/test_cluster.py --ignore tests/e2e/test_cluster_memory.py \
    >"$pg_dir/e2e.log" 2>&1 &
  pg_pid=$!
fi
finish_pg() {
  [ -n "$pg_pid" ] || return 0
  wait "$pg_pid"
  local prc=$?
  echo "== the e2e suite on a PostgreSQL store: exit $prc"
  tail -n 25 "$pg_dir/e2e.log"
  "$VENV/bin/python" scripts/postgres_for_tests.py stop "$pg_dir"
  [ $prc -eq 0 ] && rm -rf "$pg_dir"
  pg_pid=""
  return $prc
}
trap 'if [ -n "$pg_pid" ]; then kill "$pg_pid" 2>/dev/null; "$VENV/bin/python" scripts/postgres_for_tests.py stop "$pg_dir"; fi' EXIT
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
# The clients' suites (RUN_CLIENTS=1, as `make test` sets) run while the PostgreSQL pass
# may still be going: neither needs the other, and the run is shorter for it.
if [ -n "${RUN_CLIENTS:-}" ]; then
  VENV="$VENV" bash scripts/test_clients.sh || { rc=$?; finish_pg; exit $rc; }
fi
finish_pg || exit $?
