#!/usr/bin/env bash
# Regenerates clients/go/ragplanev1 from protos/ragplane/v1 with pinned plugins
# (protoc-gen-go, protoc-gen-go-grpc: see scripts/install_tools.sh) and the protoc bundled
# in grpcio-tools (pinned in constraints.txt), so the output is reproducible.
#   clients/go/generate.sh           regenerate
#   clients/go/generate.sh --check   fail if the committed code differs from a regeneration
# Needs `go` and the Python virtualenv ($VENV, default .venv; `make install` creates it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
MODULE=github.com/ragplane/ragplane/clients/go
OUT_PKG=clients/go/ragplanev1

check=0
case ${1:-} in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

[ -x "$PY" ] || { echo "generate.sh: no Python at $PY; run 'make install' first" >&2; exit 1; }
bash scripts/install_tools.sh protoc-gen-go protoc-gen-go-grpc
WKT="$("$PY" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# module= strips the go_package prefix, so files land in $tmp/ragplanev1/.
"$PY" -m grpc_tools.protoc \
  --plugin=protoc-gen-go="$ROOT/.tools/bin/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$ROOT/.tools/bin/protoc-gen-go-grpc" \
  --go_out="$tmp" --go_opt=module="$MODULE" \
  --go-grpc_out="$tmp" --go-grpc_opt=module="$MODULE" \
  -I protos -I "$WKT" \
  protos/ragplane/v1/*.proto

if [ $check -eq 1 ]; then
  if ! diff -ru "$OUT_PKG" "$tmp/ragplanev1"; then
    echo "generate.sh --check: $OUT_PKG is stale; run clients/go/generate.sh and commit" >&2
    exit 1
  fi
  echo "$OUT_PKG is up to date"
  exit 0
fi
rm -rf "$OUT_PKG"
mkdir -p "$(dirname "$OUT_PKG")"
cp -r "$tmp/ragplanev1" "$OUT_PKG"
echo "regenerated $OUT_PKG"
