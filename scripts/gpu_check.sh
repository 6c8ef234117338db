#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu_bundle.sh prepared
# .gpu/model, .gl and .whl here (carry all three): the GPU tests (`pytest -m gpu tests/gpu`)
# and then bench/gpu.py, inside a total deadline, leaving the log, the benchmark's JSON and
# markdown in $OUT. The machine has python3 with torch and sentence-transformers but no
# network, no faiss, no Vulkan loader and not this project installed (GPU.md).
#
#   bash scripts/gpu_check.sh             # there: CUDA and wgpu
#   bash scripts/gpu_check.sh --dry-run   # here: the same flow on the CPU with a few texts
#
# GPU_CHECK_SECONDS (default 360) bounds the whole run; the tests get at most a third.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
TOTAL=${GPU_CHECK_SECONDS:-360}
START=$(date +%s)
left() { echo $((TOTAL - ($(date +%s) - START))); }
OUT=${OUT:-$ROOT/bench/out/gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1

if [ "$DRY" = 1 ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  DEVICE=cpu
  SITE=$(mktemp -d)
  MODEL=$(mktemp -d)/model
else
  PY=${PYTHON:-python3}
  DEVICE=cuda
  SITE=/tmp/site
  MODEL=/tmp/ragplane-model
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=true
echo "== gpu_check $(date -u +%FT%TZ) dry_run=$DRY device=$DEVICE python=$($PY -V 2>&1)"

echo "== Vulkan loader"
if [ "$DRY" = 0 ]; then
  if [ -n "$(ls .gl/*.deb 2>/dev/null)" ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  else
    echo "   no .gl/*.deb: wgpu will find no adapter unless the machine has a loader"
  fi
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || :
else
  echo "   dry run: dpkg and ldconfig skipped"
fi
ldconfig -p 2>/dev/null | grep -m1 libvulkan || echo "   no libvulkan in ldconfig"

echo "== embedder_rs wheel -> $SITE"
whl=$(ls .whl/embedder_rs-*.whl 2>/dev/null | head -1)
if [ -n "$whl" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$whl" || echo "   the wheel did not install (wrong Python?): wgpu parts skip"
else
  echo "   no .whl/embedder_rs-*.whl: wgpu parts skip"
fi
# the installed package (a regular one) wins over the embedder_rs/ source folder, which
# Python would otherwise import as an empty namespace
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}

echo "== float32 model from .gpu/model -> $MODEL"
"$PY" - "$MODEL" <<'EOF' || { echo "   cannot write the model: nothing else can run"; exit 1; }
import shutil, sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

src, dst = Path(".gpu/model"), Path(sys.argv[1])
if not (src / "model.safetensors").exists():
    sys.exit("no .gpu/model/model.safetensors: run scripts/gpu_bundle.sh first and carry .gpu")
shutil.copytree(src, dst, dirs_exist_ok=True)
t = load_file(str(src / "model.safetensors"))
save_file({k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in t.items()},
          str(dst / "model.safetensors"), metadata={"format": "pt"})
print(f"   {len(t)} tensors, {(dst / 'model.safetensors').stat().st_size / 2**20:.1f} MiB")
EOF
export RAGPLANE_MODEL_DIR=$MODEL

echo "== GPU tests ($(left) s left)"
test_budget=$(($(left) / 3))
[ "$DRY" = 1 ] && export RAGPLANE_GPU_DRY_RUN=1
# addopts and filterwarnings cleared: that machine's library versions are not the pinned
# ones, and a deprecation there must not fail a GPU check
timeout -s INT -k 15 "$test_budget" "$PY" -m pytest -m gpu tests/gpu -q -rs -s \
  -p no:cacheprovider -o addopts="" -o filterwarnings=default -o timeout="$test_budget" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/pytest.log"
echo "   pytest exit $? (124: out of time)"
unset RAGPLANE_GPU_DRY_RUN

# the last CPU_SECONDS (default 150) are kept for bench section 4 on all of the machine's
# cores: embedder_rs against ONNX Runtime at the same thread count (issue: many cores)
CPU_SECONDS=${CPU_SECONDS:-150}
bench_budget=$(($(left) - CPU_SECONDS - 10))
echo "== bench/gpu.py ($bench_budget s)"
if [ "$DRY" = 1 ]; then
  bench_args=(--device cpu --quick --phase-seconds 30 --throughput-seconds 40)
else
  bench_args=(--device cuda --phase-seconds 45 --throughput-seconds 90)
fi
timeout -s INT -k 15 "$bench_budget" "$PY" -m bench.gpu "${bench_args[@]}" --out "$OUT" \
  2>&1 | grep -v "Loading weights" > "$OUT/bench.log"
echo "   bench exit $? after $(($(date +%s) - START)) s in all"

threads=$(nproc)
[ "$DRY" = 1 ] && cpu_args=(--rounds 1) || cpu_args=(--rounds 2)
echo "== bench section 4 on $threads CPU threads ($(left) s left)"
timeout -s INT -k 15 $(($(left) - 5)) "$PY" -m bench.rust --threads "$threads" --no-torch \
  --model-dir "$MODEL" "${cpu_args[@]}" --json "$OUT/cpu_bench.json" \
  2>&1 | grep -v "Loading weights" > "$OUT/cpu_bench.log"
echo "   cpu bench exit $? after $(($(date +%s) - START)) s in all"

echo
echo "== GPU tests, summary"
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|skipped|min cos|adapter" "$OUT/pytest.log" | tail -15
echo
cat "$OUT/gpu_bench.md" 2>/dev/null || tail -40 "$OUT/bench.log"
echo
echo "== bench section 4, $threads threads"
tail -16 "$OUT/cpu_bench.log"
