#!/usr/bin/env bash
# One GPU-machine call for the RMSNorm fused with the FP8 activation quantization
# (kernels/rmsnorm/rmsnorm_quant.h, TANDEM_FUSED_ACT_QUANT; kernels/rmsnorm/WORKLOG.md): the
# kernel's bit-exactness test, the cuBLASLt FP8 path's test (its quantization is now a
# callback), the Ops-level test (bitwise, never stale), the engine's FP8 tests with the fusion
# on and off (bitwise logits), then kb_bench's fp8norm section (norm -> quantize -> FP8 GEMM
# against the fused norm + quantize -> FP8 GEMM at the Llama-3-8B QKV and gate-up shapes).
# Staged here by engine/bench/stage_engine.sh (carry: [".gpu-pack"]).
# Usage there: kernels/bench/runs/gpu_run_actq.sh [test|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -d .gpu-eng ] || tar -xJf .gpu-pack/eng.tar.xz
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/actq-out}
mkdir -p "$OUT"
what=${1:-all}
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
run_test() {  # name timeout [args...]
  local t=$1 limit=$2
  shift 2
  timeout "$limit" $S/tests/$t "$@" >"$OUT/$t.log" 2>&1
  note "$t exit=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure$" -A3 "$OUT/$t.log" | head -24 >>"$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$OUT/smi.txt"
if [[ $what == test || $what == all ]]; then
  run_test rmsnorm_quant_gpu_test 300
  grep -E "bit-exact" "$OUT/rmsnorm_quant_gpu_test.log" | tail -4 >>"$OUT/summary.txt"
  run_test fp8_gemm_lt_gpu_test 300
  run_test engine_cuda_ops_fused_act_quant_test 120
  run_test engine_cuda_test 420 --gtest_filter='*FusedActivation*:*Fp8Prefill*:*QuantizedGraph*'
  grep -hE "bitwise|tokens identical|falls back" "$OUT/engine_cuda_test.log" | head -20 \
    >>"$OUT/summary.txt"
fi
if [[ $what == bench || $what == all ]]; then
  timeout 300 $S/bin/kb_bench "$OUT/fp8norm_bench.jsonl" fp8norm >"$OUT/fp8norm_bench.log" 2>&1 ||
    note "kb_bench fp8norm failed: $(tail -3 "$OUT/fp8norm_bench.log")"
  echo "== norm + FP8 GEMM, unfused vs fused =="
  grep -E "saved\)" "$OUT/fp8norm_bench.log"
  python3 kernels/bench/report_kb.py "$OUT/fp8norm_bench.jsonl" /dev/null
fi
echo "== status =="
cat "$OUT/summary.txt"
