#!/usr/bin/env bash
# Session 30's GPU-machine calls, most important first in each, so that a call cut short still
# brings back what it finished:
#   profile  [quant]'s batch-1 step: ncu of every kernel of a graph-replayed INT4 decode step
#            (Llama-3-8B quantized at load, ncu_step_table.py), ncu sections of the skinny
#            kernel's four GEMMs of a layer (INT4 and INT8, m = 1) and of QuantGemmTc's (INT4 at
#            m = 1 with TANDEM_QUANT_TC_SMALL_M=1, and at m = 8); then [parallel]'s GPU criterion:
#            bf16 `tandem bench` (latency, throughput) of this tree against a build from before
#            the parallel work (321edab, bin/tandem_old), interleaved, twice.
#   skinny   the skinny kernel's row tiles (kernels/quant_gemm/WORKLOG.md step 9): its GPU test,
#            the engine's quantized tests, batch-1 INT4 / INT8 `tandem bench` against this
#            session's first build (bin/tandem_base, a422d9b) in the same call (ROUNDS=1 or 2),
#            the INT4 step table again; then the [parallel] A/B of `profile`.
# Staged here (carry [".gpu-pack30"]): build 321edab's `tandem` in its own worktree and copy it to
# build/bin/tandem_old, then
#   PACK=.gpu-pack30 BINS="kb_bench tandem tandem_old" TEST_BINS="quant_gemm_gpu_test
#     quant_gemm_tc_gpu_test" engine/bench/runs/stage_pack.sh
# skinny: carry [".gpu-pack31"], staged the same way with BINS="tandem tandem_base tandem_old"
# TEST_BINS="quant_gemm_gpu_test engine_cuda_test" (tandem_base: a422d9b's build/bin/tandem).
# Usage there: PACK=.gpu-pack30 engine/bench/runs/gpu_run_s30.sh profile
#              PACK=.gpu-pack31 ROUNDS=1 engine/bench/runs/gpu_run_s30.sh skinny
set -uo pipefail
cd "$(dirname "$0")/../../.."
PACK=${PACK:-.gpu-pack30}
if [ "$(cat .gpu-eng/.pack 2>/dev/null)" != "$PACK" ]; then
  rm -rf .gpu-eng && tar -xJf "$PACK/eng.tar.xz" && echo "$PACK" >.gpu-eng/.pack
fi
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s30-out}
LOGS=$OUT/logs
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$LOGS" "$MODELS"
source engine/bench/runs/run_lib.sh  # note, run_test, make_llama
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,memory.total \
  --format=csv >"$LOGS/smi.txt"
case "$(head -2 "$LOGS/smi.txt" | tail -1)" in
  *H100*) SPEC_GBS=3350 ;;
  *) SPEC_GBS=4800 ;;
esac
cat "$LOGS/smi.txt" >>"$OUT/summary.txt"

# TAG QUANT [ENV=V...]: ncu of every kernel of graph-replayed batch-1 steps, as a step table.
step_table() {
  local tag=$1 quant=$2
  shift 2
  env "$@" timeout 150 ncu --clock-control none --graph-profiling node --launch-skip 1500 \
    --launch-count 600 --metrics gpu__time_duration.sum --csv \
    $S/bin/tandem bench --model "$m" --quantization "$quant" --scenarios latency \
    --latency-tokens 24 --max-num-seqs 8 --cuda-graph-sizes 1 \
    >"$LOGS/ncu_step_$tag.csv" 2>"$LOGS/ncu_step_$tag.err"
  note "ncu step $tag exit=$?"
  pkill -9 -f "$S/bin/tandem" 2>/dev/null  # a timed-out ncu leaves its target holding the GPU
  python3 engine/bench/ncu_step_table.py "$LOGS/ncu_step_$tag.csv" >>"$OUT/summary.txt" 2>&1
}

# TAG QUANT REGEX SCENARIO_FLAGS [ENV=V...]: ncu sections of four consecutive launches of the
# kernels matching REGEX (one layer's QKV, O, gate-up, down), graph nodes included.
kernel_sections() {
  local tag=$1 quant=$2 regex=$3 flags=$4
  shift 4
  local pattern="Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|No Eligible"
  pattern="$pattern|Executed Ipc Active|Warp Cycles Per Issued|Registers Per|Achieved Occupancy"
  pattern="$pattern|Grid Size|Block Size|Theoretical Occupancy|Executed Instructions  "
  # shellcheck disable=SC2086
  env "$@" timeout 120 ncu --clock-control none --graph-profiling node -k "regex:$regex" \
    --launch-skip 400 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section InstructionStats --section ComputeWorkloadAnalysis \
    $S/bin/tandem bench --model "$m" --quantization "$quant" $flags \
    >"$LOGS/ncu_$tag.txt" 2>&1
  note "ncu sections $tag exit=$?"
  pkill -9 -f "$S/bin/tandem" 2>/dev/null
  grep -E "^  [a-zA-Z_:<>]*QuantGemm|$pattern" "$LOGS/ncu_$tag.txt" | cut -c1-150 | head -60 \
    >>"$OUT/summary.txt"
}

# TAG BINARY: bf16 `tandem bench` latency (batch 1) and throughput (256 x 128 / 1024).
bench_ab() {
  local tag=$1 bin=$2
  timeout 150 $S/bin/$bin bench --model "$m" --scenarios latency,throughput \
    --bandwidth-gbs $SPEC_GBS --json "$LOGS/bench_$tag.json" >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^(latency|throughput)' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

profile() {
  make_llama
  local b1="--scenarios latency --latency-tokens 48"
  local b8="--scenarios decode --batch-sizes 8 --contexts 1024 --decode-tokens 16"
  step_table int4_b1 int4
  kernel_sections skinny_int4_m1 int4 QuantGemmSkinny "$b1"
  kernel_sections tc_int4_m1 int4 QuantGemmTc "$b1" TANDEM_QUANT_TC_SMALL_M=1
  kernel_sections tc_int4_m8 int4 QuantGemmTc "$b8"
  kernel_sections skinny_int8_m1 int8 QuantGemmSkinny "$b1"
  tar -C "$OUT" -czf "$OUT/logs_profile_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  for round in 1 2; do
    bench_ab old_r$round tandem_old
    bench_ab new_r$round tandem
  done
  [ $((570 - SECONDS)) -gt 100 ] && step_table int8_b1 int8
  tar -C "$OUT" -czf "$OUT/logs_profile_b.tgz" logs && rm -rf "$LOGS"
}

# TAG BINARY QUANT: batch-1 `tandem bench` of $m quantized at load.
bench_b1() {
  local tag=$1 bin=$2 quant=$3
  timeout 120 $S/bin/$bin bench --model "$m" --quantization "$quant" --scenarios latency \
    --latency-tokens 128 --bandwidth-gbs $SPEC_GBS --json "$LOGS/bench_$tag.json" \
    >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^latency' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

# The skinny kernel's new row tiles (WORKLOG.md step 9) against this session's first build
# (bin/tandem_base, a422d9b): its test, the engine's quantized tests, the INT4 step table, batch 1
# INT4 / INT8 interleaved; then [parallel]'s A/B (bf16, against bin/tandem_old = 321edab).
skinny() {
  TESTS="quant_gemm_gpu_test engine_cuda_test:*Quant*" run_named_tests 120
  make_llama
  bench_b1 int4_base_r1 tandem_base int4
  bench_b1 int4_new_r1 tandem int4
  step_table int4_b1_new int4
  bench_b1 int8_base_r1 tandem_base int8
  bench_b1 int8_new_r1 tandem int8
  if [ "${ROUNDS:-2}" -ge 2 ]; then
    for q in int4 int8; do
      bench_b1 ${q}_base_r2 tandem_base $q
      bench_b1 ${q}_new_r2 tandem $q
    done
  fi
  tar -C "$OUT" -czf "$OUT/logs_skinny_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  bench_ab old_r1 tandem_old
  bench_ab new_r1 tandem
  if [ $((560 - SECONDS)) -gt 90 ]; then
    bench_ab old_r2 tandem_old
    bench_ab new_r2 tandem
  fi
  tar -C "$OUT" -czf "$OUT/logs_skinny_b.tgz" logs && rm -rf "$LOGS"
}

case "${1:-}" in
  profile) profile ;;
  skinny) skinny ;;
  *)
    echo "usage: $0 profile|skinny" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
