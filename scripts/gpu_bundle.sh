#!/usr/bin/env bash
# Prepares, on a machine with network and the project installed, what a GPU machine without
# network needs to run scripts/gpu_check.sh (see GPU.md in the shared notes):
#   .gpu/model/  the model with float16 weights (integer tensors kept) and its small files:
#                the float32 file (91 MB) is too big to carry; gpu_check.sh writes it back
#   .gl/         the Vulkan loader and glvnd .deb files (amd64) that wgpu needs there
#   .whl/        embedder_rs built for CPython 3.12 (only with --wheel: it rebuilds pyo3)
# All three are git-ignored; name them in the device call's `carry`. Prints their sizes and
# what the whole transfer comes to (the device tool takes at most 64 MiB).
#
#   bash scripts/gpu_bundle.sh [--wheel] [--no-debs]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
WHEEL=0
DEBS=1
for arg in "$@"; do
  case "$arg" in
    --wheel) WHEEL=1 ;;
    --no-debs) DEBS=0 ;;
    *) echo "usage: $0 [--wheel] [--no-debs]" >&2; exit 2 ;;
  esac
done

echo "== model (float16) -> .gpu/model"
rm -rf .gpu/model
mkdir -p .gpu/model
"$PY" - <<'EOF'
import json, shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ragplane.server.embedding.model_files import default_model_dir

src, dst = default_model_dir(), Path(".gpu/model")
# only what sentence-transformers and the tokenizers read; not README or training data
for name in ("config.json", "config_sentence_transformers.json", "modules.json",
             "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json",
             "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json"):
    if (src / name).exists():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, dst / name)
tensors = load_file(str(src / "model.safetensors"))
half = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in tensors.items()}
kept = sorted(k for k, v in tensors.items() if v.dtype != np.float32)
save_file(half, str(dst / "model.safetensors"), metadata={"format": "pt"})
json.dump({"from": str(src.name), "kept_dtype": kept}, open(dst / "BUNDLE.json", "w"))
print(f"   {len(half)} tensors to float16, kept as they were: {kept}")
EOF

if [ "$DEBS" = 1 ]; then
  echo "== Vulkan loader and glvnd (amd64) -> .gl"
  rm -rf .gl && mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  # shellcheck disable=SC2086
  apt-get $o -qq update
  # shellcheck disable=SC2086
  (cd .gl && apt-get $o -qq download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi

if [ "$WHEEL" = 1 ]; then
  echo "== embedder_rs wheel for CPython 3.12 -> .whl"
  # a pyenv shim on PATH may name a version that is installed but not selected: take the
  # first candidate that actually runs (PY312 overrides)
  PY312=${PY312:-}
  if [ -z "$PY312" ]; then
    for c in "$(command -v python3.12 || true)" \
      $(command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null); do
      if [ -n "$c" ] && "$c" -c 'import sys' 2>/dev/null; then PY312=$c; break; fi
    done
  fi
  [ -n "$PY312" ] || { echo "error: no working python3.12 to build the wheel for (set PY312)" >&2; exit 1; }
  rm -f .whl/embedder_rs-*.whl
  mkdir -p .whl
  MATURIN="$(cd "$VENV" && pwd)/bin/maturin"
  (cd embedder_rs && "$MATURIN" build --release -i "$PY312" -o ../.whl)
  ls -la .whl/embedder_rs-*.whl
fi

echo "== sizes"
du -sh .gpu/model .gl .whl 2>/dev/null || :
# the device tool sends tracked and untracked-not-ignored files plus the carried folders
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carried=$(for d in .gpu .gl .whl; do if [ -d "$d" ]; then echo "$d"; fi; done)
# shellcheck disable=SC2086
carry_bytes=$(du -cb $carried | tail -1 | cut -f1)
total=$((tree_bytes + carry_bytes))
printf '   working tree %.1f MiB + carried %.1f MiB = %.1f MiB (limit 64 MiB)\n' \
  "$(echo "$tree_bytes/1048576" | bc -l)" "$(echo "$carry_bytes/1048576" | bc -l)" \
  "$(echo "$total/1048576" | bc -l)"
if [ "$total" -ge $((64 * 1048576)) ]; then
  echo "error: the transfer would be over 64 MiB" >&2
  exit 1
fi
[ -n "$(ls .whl/embedder_rs-*cp312*.whl 2>/dev/null)" ] ||
  echo "note: no cp312 embedder_rs wheel in .whl (run with --wheel); the wgpu parts will skip"
