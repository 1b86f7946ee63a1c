#!/usr/bin/env bash
# Session 29's GPU-machine calls, most important first in each, so that a call cut short still
# brings back what it finished:
#   tc      [decode-tc]'s table on this card (kernels/bench/runs/gpu_run_fipeer.sh: tandem's
#           decode kernel with its default cp.async stages, FlashInfer's tensor-core and
#           CUDA-core decode, SDPA), tandem again with TMA stages (TANDEM_DECODE_COPIES=tma,
#           paged_attention WORKLOG step 19) joined with the same call's peer rows, ncu of
#           FlashInfer's tensor-core kernel and of tandem's (both fillings) at 128 x 4k (64);
#           then Llama-3-8B bf16 `tandem bench` (all four scenarios, the floor at this card's
#           spec bandwidth) and the attention GPU tests no H100 call has reached yet.
#   quant   [quant]'s QuantGemmTc split-K and m = 1..4 (kernels/quant_gemm/WORKLOG.md step 8):
#           its GPU tests, `kb_bench - quant` (unsplit / split rows), the engine's quantized
#           tests under TANDEM_QUANT_TC=require with TANDEM_QUANT_TC_SMALL_M=1, then `tandem
#           bench` INT8 / INT4 (Llama-3-8B quantized at load): default, TANDEM_QUANT_TC_SPLIT=0,
#           TANDEM_QUANT_TC_SMALL_M=1 (batch 1); bf16 throughput and decode at 4k with the new
#           TMA default against TANDEM_DECODE_COPIES=cp.async; engine_cuda_test with what is left.
#   plan    the split planner's 4-chunks-a-warp minimum (WORKLOG.md step 8): the kernel and
#           engine quantized tests, `kb_bench - quant`, INT8 / INT4 decode split against
#           TANDEM_QUANT_TC_SPLIT=0 (same pack as quant).
# Staged here (tc: carry [".gpu-fipeer", ".gpu-pack28"]): .gpu-fipeer by
# kernels/bench/runs/stage_flashinfer_peer.sh; .gpu-pack28 as in gpu_run_s28.sh. quant: carry
# [".gpu-pack29"], staged by
#   PACK=.gpu-pack29 BINS="kb_bench tandem" TEST_BINS="quant_gemm_tc_gpu_test quant_gemm_gpu_test
#     engine_cuda_test" engine/bench/runs/stage_pack.sh
# Usage there: engine/bench/runs/gpu_run_s29.sh tc; PACK=.gpu-pack29 engine/bench/runs/gpu_run_s29.sh quant
set -uo pipefail
cd "$(dirname "$0")/../../.."
PACK=${PACK:-.gpu-pack28}
if [ "$(cat .gpu-eng/.pack 2>/dev/null)" != "$PACK" ]; then
  rm -rf .gpu-eng && tar -xJf "$PACK/eng.tar.xz" && echo "$PACK" >.gpu-eng/.pack
fi
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s29-out}
LOGS=$OUT/logs
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$LOGS" "$MODELS"
source engine/bench/runs/run_lib.sh  # note, run_test, make_llama
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,memory.total \
  --format=csv >"$LOGS/smi.txt"
# The floor `tandem bench` prints: this card's spec bandwidth (H100 SXM 3350, H200 4800 GB/s).
case "$(head -2 "$LOGS/smi.txt" | tail -1)" in
  *H100*) SPEC_GBS=3350 ;;
  *) SPEC_GBS=4800 ;;
esac

FI=.gpu-fipeer
tc() {
  local f=$OUT/fipeer
  OUT=$f timeout 330 kernels/bench/runs/gpu_run_fipeer.sh all >"$LOGS/fipeer_run.txt" 2>&1
  note "gpu_run_fipeer exit=$?"
  cat "$f/summary.log" >>"$OUT/summary.txt" 2>/dev/null
  env TANDEM_DECODE_COPIES=tma timeout 100 $FI/attention_bench decode_tc >"$f/attention_tma.log" 2>&1
  note "attention_bench decode_tc (tma) exit=$? rows=$(grep -c 'kernel=decode' "$f/attention_tma.log")"
  grep '^PEER' "$f/attention.log" >"$f/peers.log"
  python3 kernels/bench/attention_table.py "$f/attention_tma.log" "$f/peers.log" \
    >"$f/table_tma.txt" 2>&1
  { echo "== cp.async (default)"; sed -n '/^| B x L/,$p' "$f/table.txt"
    echo "== TMA stages"; sed -n '/^| B x L/,$p' "$f/table_tma.txt"; } >>"$OUT/summary.txt"
  local pattern="DRAM Throughput|Duration|Memory Throughput|L2 Hit Rate|Mem Busy|Max Bandwidth"
  pattern="$pattern|No Eligible|Issue Slots Busy|Registers|Achieved Occupancy|Grid Size"
  local sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
    --section SchedulerStats --section Occupancy --section LaunchStats)
  timeout 90 ncu --clock-control none -k regex:BatchPrefill --launch-skip 10 --launch-count 1 \
    "${sections[@]}" $FI/flashinfer_peer one 128 4096 64 4 >"$LOGS/ncu_fi_tc.txt" 2>&1
  note "ncu FlashInfer TC 128 x 4096 (64) exit=$?"
  grep -E "$pattern" "$LOGS/ncu_fi_tc.txt" | head -16 >>"$OUT/summary.txt"
  for copies in cp.async tma; do
    env TANDEM_DECODE_COPIES=$copies timeout 90 ncu --clock-control none -k regex:DecodeKernel \
      --launch-skip 20 --launch-count 1 "${sections[@]}" $FI/attention_bench one 128 4096 64 bf16 \
      >"$LOGS/ncu_tandem_$copies.txt" 2>&1
    note "ncu tandem 128 x 4096 (64) $copies exit=$?"
    grep -E "$pattern" "$LOGS/ncu_tandem_$copies.txt" | head -16 >>"$OUT/summary.txt"
  done
  tar -C "$OUT" -czf "$OUT/logs_tc_a.tgz" fipeer logs && rm -rf "$f" "$LOGS" && mkdir -p "$LOGS"
  make_llama
  timeout $((560 - SECONDS > 30 ? 560 - SECONDS : 30)) $S/bin/tandem bench --model "$m" \
    --bandwidth-gbs $SPEC_GBS --json "$LOGS/bench_bf16.json" >"$LOGS/bench_bf16.log" 2>&1
  note "bench bf16 (floor at $SPEC_GBS GB/s) exit=$?"
  grep -E '^(latency|decode|prefill|throughput|startup|  )' "$LOGS/bench_bf16.log" | head -30 \
    >>"$OUT/summary.txt"
  tar -C "$OUT" -czf "$OUT/logs_tc_b.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  local left=$((585 - SECONDS))
  if [ $left -gt 30 ]; then
    run_test attention_gpu_test $left --gtest_filter='*DecodeMagnitudesFarFromOne:*DecodeDefaultKernel:PagedAttentionFp8GpuTest.StreamKernelOnSplitUnsplitAndBalancedPlans:PagedAttentionFp8GpuTest.DecodeAfterRopeKvStoreWithPdl:*PrefillChunksOverCachedPages'
  fi
  tar -C "$OUT" -czf "$OUT/logs_tc_c.tgz" logs && rm -rf "$LOGS"
}

# TAG QUANT SCENARIOS [ENV=V...]: `tandem bench` on $m quantized at load to QUANT.
bench_quant() {
  local tag=$1 quant=$2 scen=$3
  shift 3
  env "$@" timeout 150 $S/bin/tandem bench --model "$m" --quantization "$quant" \
    --scenarios "$scen" --latency-tokens 128 --batch-sizes 8,16,32,64 --contexts 1024 \
    --decode-tokens 32 --bandwidth-gbs $SPEC_GBS --json "$LOGS/bench_$tag.json" \
    >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^(latency|decode)' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

# TAG [ENV=V...]: `tandem bench` bf16 throughput (256 x 128 / 1024) and decode B = 64, 4k.
bench_bf16() {
  local tag=$1
  shift
  env "$@" timeout 120 $S/bin/tandem bench --model "$m" --scenarios decode,throughput \
    --batch-sizes 64 --contexts 4096 --decode-tokens 32 --bandwidth-gbs $SPEC_GBS \
    --json "$LOGS/bench_$tag.json" >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^(decode|throughput)' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

quant() {
  TESTS="quant_gemm_tc_gpu_test quant_gemm_gpu_test" run_named_tests 120
  (export TANDEM_QUANT_TC=require TANDEM_QUANT_TC_SMALL_M=1 TAG=_require_small_m
    run_test engine_cuda_test 120 --gtest_filter='*Quant*')
  timeout 180 $S/bin/kb_bench - quant >"$LOGS/kb_quant.log" 2>&1
  note "kb_bench quant exit=$?"
  grep -E "ceilings|quant_gemm\.|quant_gemm_tc" "$LOGS/kb_quant.log" >>"$OUT/summary.txt"
  tar -C "$OUT" -czf "$OUT/logs_quant_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  make_llama
  for q in int8 int4; do
    bench_quant ${q}_default $q latency,decode
    bench_quant ${q}_nosplit $q latency,decode TANDEM_QUANT_TC_SPLIT=0
    bench_quant ${q}_small_m $q latency TANDEM_QUANT_TC_SMALL_M=1
  done
  bench_bf16 bf16_default
  bench_bf16 bf16_cpasync TANDEM_DECODE_COPIES=cp.async
  tar -C "$OUT" -czf "$OUT/logs_quant_b.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  local left=$((585 - SECONDS))
  [ $left -gt 30 ] && run_test engine_cuda_test $left --gtest_filter='-*Quant*'
  tar -C "$OUT" -czf "$OUT/logs_quant_c.tgz" logs && rm -rf "$LOGS"
}

plan() {
  TESTS="quant_gemm_tc_gpu_test engine_cuda_test:*Quant*" run_named_tests 120
  timeout 120 $S/bin/kb_bench - quant >"$LOGS/kb_quant.log" 2>&1
  note "kb_bench quant exit=$?"
  grep -E "ceilings|quant_gemm_tc" "$LOGS/kb_quant.log" | grep -E "ceilings| M=(1|8|16) " \
    >>"$OUT/summary.txt"
  make_llama
  for q in int8 int4; do
    bench_quant ${q}_default $q latency,decode
    bench_quant ${q}_nosplit $q latency,decode TANDEM_QUANT_TC_SPLIT=0
  done
  tar -C "$OUT" -czf "$OUT/logs_plan.tgz" logs && rm -rf "$LOGS"
}

case "${1:-}" in
  tc) tc ;;
  quant) quant ;;
  plan) plan ;;
  *)
    echo "usage: $0 tc|quant|plan" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
