#!/usr/bin/env bash
# One GPU-machine call for the cuBLASLt FP8 W8A8 path (kernels/quant_gemm/fp8_gemm_lt.h,
# kernels/quant_gemm/WORKLOG.md step 4): its kernel test, the quantized kernel tests, the engine's
# quantized-checkpoint tests (the FP8 prefill one requires the new path), then kb_bench's fp8
# section and its torch._scaled_mm peer (peer_fp8.py) in the same call, the merged table last.
# Staged here by engine/bench/stage_engine.sh (carry: [".gpu-pack"]; it stages
# fp8_gemm_lt_gpu_test, quant_gemm_gpu_test, engine_cuda_test and kb_bench).
# Usage there: kernels/bench/runs/gpu_run_fp8.sh [test|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -d .gpu-eng ] || tar -xJf .gpu-pack/eng.tar.xz
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fp8-out}
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
  run_test fp8_gemm_lt_gpu_test 300
  grep -E "worst error" "$OUT/fp8_gemm_lt_gpu_test.log" | sort -k13 -g | tail -3 >>"$OUT/summary.txt"
  run_test quant_gemm_gpu_test 300
  run_test engine_cuda_test 420 --gtest_filter='*Quantized*:*Fp8*:*LoadTimeQuantization*'
  grep -hE "fp8.*max \|cuda|greedy tokens|graphs vs eager|falls back" "$OUT/engine_cuda_test.log" |
    head -60 >>"$OUT/summary.txt"
fi
if [[ $what == bench || $what == all ]]; then
  timeout 400 $S/bin/kb_bench "$OUT/fp8_bench.jsonl" fp8 >"$OUT/fp8_bench.log" 2>&1 ||
    note "kb_bench fp8 failed: $(tail -3 "$OUT/fp8_bench.log")"
  timeout 300 python3 kernels/bench/peer_fp8.py "$OUT/fp8_peer.jsonl" >"$OUT/fp8_peer.log" 2>&1 ||
    note "peer_fp8.py failed: $(tail -3 "$OUT/fp8_peer.log")"
  grep -E "not timed|no 128x128" "$OUT/fp8_peer.log" | head -5 >>"$OUT/summary.txt"
  echo "== FP8 GEMMs (TFLOP/s against the bf16 ceiling of the same run; torch: same row name) =="
  python3 kernels/bench/report_kb.py "$OUT/fp8_bench.jsonl" "$OUT/fp8_peer.jsonl"
fi
echo "== status =="
cat "$OUT/summary.txt"
