#!/usr/bin/env bash
# One GPU-machine call for the tuned cuBLASLt plans (kernels/common/cublaslt_autotune.h,
# kernels/quant_gemm/WORKLOG.md step 5): the FP8 and bf16 GEMM tests (their tuning tests force
# tuning on: m = 1, 7, 33, 256 at n = 4096 / 6144, accumulate, a plan made under capture), the
# engine's FP8 tests, then `kb_bench lttune` (every Llama-3-8B shape at M = 1 .. 8192, the plan
# untuned against tuned in one process) with its per-shape lines last.
# Staged here by engine/bench/stage_engine.sh (carry: [".gpu-pack"]; it stages
# fp8_gemm_lt_gpu_test, kernels_kb_gpu_test, engine_cuda_test and kb_bench).
# Usage there: kernels/bench/runs/gpu_run_lttune.sh [test|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -d .gpu-eng ] || tar -xJf .gpu-pack/eng.tar.xz
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/lttune-out}
mkdir -p "$OUT"
what=${1:-all}
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
run_test() {  # name timeout [args...]
  local t=$1 limit=$2
  shift 2
  timeout "$limit" $S/tests/$t "$@" >"$OUT/$t.log" 2>&1
  note "$t exit=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure$" -A3 "$OUT/$t.log" | head -24 >>"$OUT/summary.txt"
  grep -E "^tuned " "$OUT/$t.log" >>"$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$OUT/smi.txt"
if [[ $what == test || $what == all ]]; then
  run_test fp8_gemm_lt_gpu_test 300
  run_test kernels_kb_gpu_test 300 --gtest_filter='GemmCudaTest.*'
  run_test engine_cuda_test 420 --gtest_filter='*Fp8*:*Quantized*'
  note "engine_cuda_test: $(grep -c 'cuBLASLt .*: candidate' "$OUT/engine_cuda_test.log") plans tuned," \
    "$(grep -c 'untimed' "$OUT/engine_cuda_test.log") untimed"
fi
if [[ $what == bench || $what == all ]]; then
  timeout 500 $S/bin/kb_bench "$OUT/lttune.jsonl" lttune >"$OUT/lttune.log" 2>&1 ||
    note "kb_bench lttune failed: $(tail -3 "$OUT/lttune.log")"
  echo "== cuBLASLt plans, the heuristic's first against tuned (us) =="
  grep -E "^  lttune\." "$OUT/lttune.log"
fi
echo "== status =="
cat "$OUT/summary.txt"
