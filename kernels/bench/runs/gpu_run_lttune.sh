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
LOGS=$OUT/logs
mkdir -p "$LOGS"
source engine/bench/runs/run_lib.sh  # note, run_test
what=${1:-all}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$LOGS/smi.txt"
if [[ $what == test || $what == all ]]; then
  run_test fp8_gemm_lt_gpu_test 300
  run_test kernels_kb_gpu_test 300 --gtest_filter='GemmCudaTest.*'
  grep -hE "^tuned " "$LOGS/fp8_gemm_lt_gpu_test.log" "$LOGS/kernels_kb_gpu_test.log" >>"$OUT/summary.txt"
  run_test engine_cuda_test 420 --gtest_filter='*Fp8*:*Quantized*'
  note "engine_cuda_test: $(grep -c 'cuBLASLt .*: candidate' "$LOGS/engine_cuda_test.log") plans" \
    "tuned, $(grep -c 'untimed' "$LOGS/engine_cuda_test.log") untimed"
fi
if [[ $what == bench || $what == all ]]; then
  timeout 500 $S/bin/kb_bench "$LOGS/lttune.jsonl" lttune >"$LOGS/lttune.log" 2>&1 ||
    note "kb_bench lttune failed: $(tail -3 "$LOGS/lttune.log")"
  echo "== cuBLASLt plans, the heuristic's first against tuned (us) =="
  grep -E "^  lttune\." "$LOGS/lttune.log"
fi
echo "== status =="
cat "$OUT/summary.txt"
