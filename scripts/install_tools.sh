#!/usr/bin/env bash
# Installs the pinned Go tools into .tools/bin (repository-local, git-ignored):
#   grpcurl             for tests/e2e/test_grpcurl.py and for calling the server by hand
#   protoc-gen-go       \ used by clients/go/generate.sh; pinned so that regenerating
#   protoc-gen-go-grpc  / reproduces the committed code byte for byte
#   ghz                 a gRPC load generator in Go (bench/ann_scale.py's concurrent load);
#                       not in the default set: `scripts/install_tools.sh ghz`
# Idempotent: a tool already at its pinned version is left alone. Needs only `go`.
# Usage: scripts/install_tools.sh [grpcurl|protoc-gen-go|protoc-gen-go-grpc ...]  (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."

GRPCURL_VERSION=v1.9.4
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
GHZ_VERSION=v0.120.0

BIN="$PWD/.tools/bin"
mkdir -p "$BIN"

if ! command -v go >/dev/null 2>&1; then
  echo "install_tools.sh: 'go' is not on PATH; install Go (https://go.dev/dl/) first" >&2
  exit 1
fi

# The version a binary was built from, as `go version -m` records it.
built_version() {
  [ -x "$BIN/$1" ] || return 0
  go version -m "$BIN/$1" 2>/dev/null | awk '$1 == "mod" { print $3; exit }'
}

install() {  # name package version
  local name=$1 pkg=$2 version=$3
  if [ "$(built_version "$name")" = "$version" ]; then
    return 0
  fi
  echo "installing $name $version into .tools/bin" >&2
  GOBIN="$BIN" go install "$pkg@$version"
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(grpcurl protoc-gen-go protoc-gen-go-grpc)
for t in "${tools[@]}"; do
  case $t in
    grpcurl) install grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION" ;;
    protoc-gen-go) install protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION" ;;
    protoc-gen-go-grpc)
      install protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" ;;
    ghz) install ghz github.com/bojand/ghz/cmd/ghz "$GHZ_VERSION" ;;
    *) echo "install_tools.sh: unknown tool '$t'" >&2; exit 2 ;;
  esac
done
