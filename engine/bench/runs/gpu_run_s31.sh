#!/usr/bin/env bash
# Session 31's GPU-machine call, most important first, so that a call cut short still brings back
# what it finished:
#   gemv  the tensor-core GEMV (QuantGemv, kernels/quant_gemm/WORKLOG.md step 10): its GPU test,
#         `kb_bench - quant` (isolated launches at ring depths 8 / 4 / 2, and chains of 8 PDL
#         launches against the skinny kernel and QuantGemmTc), batch-1 INT4 / INT8 `tandem bench`
#         of Llama-3-8B quantized at load with TANDEM_QUANT_GEMV=1 (the default) and =0 (the
#         skinny kernel) interleaved in the same call, the INT4 batch-1 step table under ncu, the
#         engine's quantized tests, then a second bench round if time is left.
# Staged here (carry [".gpu-pack32"]):
#   PACK=.gpu-pack32 BINS="kb_bench tandem" TEST_BINS="quant_gemm_tc_gpu_test engine_cuda_test"
#     engine/bench/runs/stage_pack.sh
#   tiled the GEMV on QuantLayout::kTc16 codes: the GPU test (kTc16 shapes, the repack against the
#         host layout), ncu sections of one int4 gate-up launch of each kernel (kb_bench quantone),
#         `kb_bench - quant` again (T16 rows), then decode batches 2 / 4 INT4 / INT8 with
#         QuantGemmTc from m = 2 (the new default) against TANDEM_QUANT_TC_MIN_M=5 (the skinny
#         kernel up to 4), the engine's quantized tests, and batch 1. Carry [".gpu-pack33"],
#         staged as gemv's.
# Usage there: PACK=.gpu-pack32 engine/bench/runs/gpu_run_s31.sh gemv
#              PACK=.gpu-pack33 engine/bench/runs/gpu_run_s31.sh tiled
set -uo pipefail
cd "$(dirname "$0")/../../.."
PACK=${PACK:-.gpu-pack32}
if [ "$(cat .gpu-eng/.pack 2>/dev/null)" != "$PACK" ]; then
  rm -rf .gpu-eng && tar -xJf "$PACK/eng.tar.xz" && echo "$PACK" >.gpu-eng/.pack
fi
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s31-out}
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

# TAG QUANT [ENV=V...]: batch-1 `tandem bench` of $m quantized at load.
bench_b1() {
  local tag=$1 quant=$2
  shift 2
  env "$@" timeout 120 $S/bin/tandem bench --model "$m" --quantization "$quant" \
    --scenarios latency --latency-tokens 128 --bandwidth-gbs $SPEC_GBS \
    --json "$LOGS/bench_$tag.json" >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^latency' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

gemv() {
  TESTS="quant_gemm_tc_gpu_test" run_named_tests 200
  timeout 240 $S/bin/kb_bench - quant >"$LOGS/kb_quant.txt" 2>&1
  note "kb_bench quant exit=$?"
  grep -E "ceiling|quant_gemv|quant_chain|quant_gemm\.w(4|8)a16.* M=1 |quant_gemm_tc\.w.* M=(1|8) " \
    "$LOGS/kb_quant.txt" | cut -c1-140 >>"$OUT/summary.txt"
  make_llama
  for q in int4 int8; do
    bench_b1 ${q}_gemv_r1 $q TANDEM_QUANT_GEMV=1
    bench_b1 ${q}_skinny_r1 $q TANDEM_QUANT_GEMV=0
  done
  tar -C "$OUT" -czf "$OUT/logs_gemv_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  step_table int4_b1_gemv int4
  TESTS="engine_cuda_test:*Quant*" run_named_tests 150
  if [ $((560 - SECONDS)) -gt 100 ]; then
    for q in int4 int8; do
      bench_b1 ${q}_skinny_r2 $q TANDEM_QUANT_GEMV=0
      bench_b1 ${q}_gemv_r2 $q TANDEM_QUANT_GEMV=1
    done
  fi
  tar -C "$OUT" -czf "$OUT/logs_gemv_b.tgz" logs && rm -rf "$LOGS"
}

# TAG CODE KERNEL M K N [DEPTH]: ncu sections of one `kb_bench - quantone` launch.
quant_sections() {
  local tag=$1
  shift
  local pattern="Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|No Eligible"
  pattern="$pattern|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Grid Size"
  pattern="$pattern|Theoretical Occupancy|L2 Hit Rate|L1/TEX Hit|Mem Busy|Max Bandwidth|Stall"
  timeout 90 ncu --clock-control none -k "regex:Quant" --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats \
    $S/bin/kb_bench - quantone "$@" >"$LOGS/ncu_$tag.txt" 2>&1
  note "ncu $tag ($*) exit=$?"
  grep -E "$pattern" "$LOGS/ncu_$tag.txt" | cut -c1-120 | head -24 >>"$OUT/summary.txt"
}

# TAG QUANT B [ENV=V...]: decode tokens/s at batch B, context 1024.
bench_decode() {
  local tag=$1 quant=$2 b=$3
  shift 3
  env "$@" timeout 120 $S/bin/tandem bench --model "$m" --quantization "$quant" \
    --scenarios decode --batch-sizes "$b" --contexts 1024 --decode-tokens 64 \
    --json "$LOGS/bench_$tag.json" >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^decode' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

# The GEMV on the tile-major layout (QuantLayout::kTc16) against the row-major one, under ncu
# beside the skinny kernel and QuantGemmTc; then QuantGemmTc from m = 2 (TANDEM_QUANT_TC_MIN_M's
# new default) against the skinny kernel up to m = 4 (=5) at decode batches 2 and 4, end to end.
tiled() {
  TESTS="quant_gemm_tc_gpu_test" run_named_tests 240
  for kernel in gemv gemv_tc16 skinny tc; do
    quant_sections ${kernel}_int4_gateup int4 $kernel 1 4096 28672 0
  done
  quant_sections gemv_tc16_d2_int4_gateup int4 gemv_tc16 1 4096 28672 2
  which cuobjdump nvdisasm >>"$OUT/summary.txt" 2>&1
  timeout 240 $S/bin/kb_bench - quant >"$LOGS/kb_quant.txt" 2>&1
  note "kb_bench quant exit=$?"
  grep -E "ceilings|quant_gemv|quant_chain_(gemv|tc|skinny)\.w" "$LOGS/kb_quant.txt" |
    grep -E "T16|chain" | cut -c1-140 >>"$OUT/summary.txt"
  tar -C "$OUT" -czf "$OUT/logs_tiled_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  make_llama
  for q in int4 int8; do
    for b in 2 4; do
      bench_decode ${q}_b${b}_tc $q $b
      bench_decode ${q}_b${b}_skinny $q $b TANDEM_QUANT_TC_MIN_M=5
    done
  done
  TESTS="engine_cuda_test:*Quant*" run_named_tests 150
  bench_b1 int4_b1_default int4
  tar -C "$OUT" -czf "$OUT/logs_tiled_b.tgz" logs && rm -rf "$LOGS"
}

case "${1:-}" in
  gemv) gemv ;;
  tiled) tiled ;;
  *)
    echo "usage: $0 gemv|tiled" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
