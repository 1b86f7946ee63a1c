#!/usr/bin/env bash
# One GPU-machine call for the tuned cuBLASLt plans (kernels/common/cublaslt_autotune.h,
# kernels/quant_gemm/WORKLOG.md step 5): the FP8 and bf16 GEMM tests (their tuning tests force
# tuning on: m = 1, 7, 33, 256 at n = 4096 / 6144, accumulate, a plan made under capture), the
# engine's FP8 tests, then `kb_bench lttune` (every Llama-3-8B shape at M = 1 .. 8192, the plan
# untuned against tuned in one process) with its per-shape lines last.
# Staged here by engine/bench/stage_engine.sh (carry: [".gpu-pack"]; it stages
# fp8_gemm_lt_gpu_test, kernels_kb_gpu_test, engine_cuda_test and kb_bench).
# Usage there: kernels/bench/runs/gpu_run_lttune.sh [test|bench|all|extra]
# extra (WORKLOG step 6, the candidates beyond the heuristic's, and our own split-k): the tuning
# and split tests only (LtAutotuneTest.*: tuned with extras and every accepted extra
# configuration forced against the reference; Fp8LtSplitTest.*), `kb_bench lttune_extra` (the
# four FP8 decode shapes at M = 128, 256, 512, both layouts: heuristic, best extra with its
# configuration, tuned), `kb_bench lttune_dump o 256 channel` (every accepted configuration of O
# at M = 256 with its time) and `kb_bench fp8split` (QKV, O, down unsplit against S = 2, 3, 4,
# graph-replayed).
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
if [[ $what == extra ]]; then
  run_test fp8_gemm_lt_gpu_test 100 --gtest_filter='LtAutotuneTest.*:Fp8LtSplitTest.*'
  grep -hE "^(with extras|extra candidates|layout .* candidates forced)" \
    "$LOGS/fp8_gemm_lt_gpu_test.log" >>"$OUT/summary.txt"
  timeout 60 $S/bin/kb_bench "$LOGS/fp8split.jsonl" fp8split >"$LOGS/fp8split.log" 2>&1 ||
    note "kb_bench fp8split failed: $(tail -3 "$LOGS/fp8split.log")"
  timeout 150 $S/bin/kb_bench "$LOGS/lttune_extra.jsonl" lttune_extra >"$LOGS/lttune_extra.log" 2>&1 ||
    note "kb_bench lttune_extra failed: $(tail -3 "$LOGS/lttune_extra.log")"
  timeout 90 $S/bin/kb_bench "$LOGS/lttune_dump.jsonl" lttune_dump o 256 channel \
    >"$LOGS/lttune_dump.log" 2>&1 || note "kb_bench lttune_dump failed: $(tail -3 "$LOGS/lttune_dump.log")"
  echo "== FP8 decode GEMMs: heuristic, best extra configuration, tuned with extras =="
  grep -E "^  lttune_extra\." "$LOGS/lttune_extra.log"
  echo "== FP8 split-k of our own (per-channel; graph-replayed) =="
  grep -E "^  fp8split " "$LOGS/fp8split.log"
  echo "== O at M = 256, per-channel: every accepted configuration =="
  grep -E "^lttune_dump|^  (caps|lttune_dump\.)" "$LOGS/lttune_dump.log"
fi
echo "== status =="
cat "$OUT/summary.txt"
