#!/usr/bin/env bash
# Session 24's GPU-machine calls, most important first in each, so that a call cut short still
# brings back what it finished:
#   stream  the fused FP8 decode kernel's stream variant (kernels/paged_attention/WORKLOG.md step
#           16): the SASS check, the attention GPU tests (the stream kernel is the default for
#           plans without merges), compute-sanitizer memcheck + racecheck on the small fp8 case
#           and on the stream kernel's own test, decode attention at short and long contexts for
#           bf16 / stream / ring / ring3 in the same process set, ncu at 256 x 640, then
#           `tandem bench` throughput (256 x 128 in / 1024 out, Llama-3-8B shapes, FP8 weights
#           quantized at load, FP8 KV) on the stream and the ring variant ([quant]'s 25,000).
#   peers   [decode-tc]'s table: kernels/bench/runs/gpu_run_fipeer.sh (tandem's decode_tc shapes,
#           FlashInfer's tensor-core and CUDA-core decode, SDPA), then the
#           op profile of the served 256-sequence FP8 decode step with the stream and the ring
#           variant. Carry .gpu-packfi too: .gpu-fipeer packed (tar -cf - .gpu-fipeer | xz).
#   bf16    the stream kernel on a bf16 cache (WORKLOG.md step 17): the attention GPU tests and
#           sanitizers, bf16 stream vs ring at short and long contexts (pages 64 and 16).
#   final   the merged tree: the helpers' GPU tests (TP, quantized TP / PP, PP on CUDA, the tuned
#           cuBLASLt plans), then `tandem bench` throughput with FP8 weights + FP8 KV, the
#           cuBLASLt plans tuned and untuned (TANDEM_LT_AUTOTUNE=1 / 0; run 36 ran the tuned one
#           with the then default, on).
#   tests   named test binaries of the pack: TESTS="bin[:gtest filter] ..." (e.g. a helper's).
# Staged here (carry: [".gpu-pack24"]):
#   PACK=.gpu-pack24 EXTRA_TESTS="engine_cuda_tp_test" engine/bench/runs/stage_pack.sh
# Usage there: engine/bench/runs/gpu_run_s24.sh stream|peers|bf16|final|tests
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -d .gpu-eng ] || tar -xJf .gpu-pack24/eng.tar.xz
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s24-out}
LOGS=$OUT/logs
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$LOGS" "$MODELS"
source engine/bench/runs/run_lib.sh  # note, run_test, bench_tp, ncu_decode, run_named_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$LOGS/smi.txt"

attention_one() {  # B L page kv variant: one `attention_bench one` shape, its graph time noted
  local f=$LOGS/one_${1}_${2}_${3}_${4}_$5.log
  TANDEM_DECODE_UNSPLIT=$5 timeout 60 $S/bin/attention_bench one "$1" "$2" "$3" "$4" >"$f" 2>&1
  note "attention one $1 $2 $3 $4 $5: $(grep -m1 -oE ' us=[0-9.]+ TBps=[0-9.]+.*graph_us=[0-9.]+ graph_TBps=[0-9.]+' \
    "$f" | cut -d' ' -f2-3,5-7)"
}

case "${1:-}" in
  stream)
    tools/gpu/check-sass.sh $S/bin/tandem $S/tests/attention_gpu_test >"$LOGS/check_sass.txt" 2>&1
    note "check-sass exit=$?: $(grep -c clean "$LOGS/check_sass.txt") clean"
    run_test attention_gpu_test 240
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $S/tests/attention_gpu_test \
        --gtest_filter='PagedAttentionFp8GpuTest.SmallForSanitizer' >"$LOGS/san_$tool.log" 2>&1
      note "compute-sanitizer $tool exit=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' \
        "$LOGS/san_$tool.log" | tr '\n' ' ')"
    done
    for shape in "256 640 16" "256 1024 16" "256 2048 16" "64 640 16" "128 4096 16" \
      "32 4096 16" "256 4096 16" "32 8192 16" "32 4096 64"; do
      attention_one $shape bf16 stream
      for variant in stream ring ring3; do attention_one $shape fused $variant; done
    done
    for variant in stream ring; do
      NCU_ENV="TANDEM_DECODE_UNSPLIT=$variant" ncu_decode short_$variant 256 640 16 fused \
        "DRAM Throughput|Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Achieved Occupancy|Registers" \
        SpeedOfLight WarpStateStats SchedulerStats Occupancy LaunchStats
    done
    tar -C "$OUT" -czf "$OUT/logs_kernel.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
    make_llama
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_stream
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_ring TANDEM_DECODE_UNSPLIT=ring
    run_named_tests 200
    tar -C "$OUT" -czf "$OUT/logs_bench.tgz" logs && rm -rf "$LOGS"
    ;;
  peers)
    [ -d .gpu-fipeer ] || tar -xJf .gpu-packfi/fipeer.tar.xz  # kernels/bench/runs/stage_flashinfer_peer.sh's
    OUT=$OUT/fipeer timeout 300 kernels/bench/runs/gpu_run_fipeer.sh all >"$LOGS/fipeer_run.txt" 2>&1
    note "gpu_run_fipeer exit=$?"
    cat "$OUT/fipeer/table.txt" >>"$OUT/summary.txt" 2>/dev/null
    tar -C "$OUT" -czf "$OUT/logs_fipeer.tgz" fipeer && rm -rf "$OUT/fipeer"
    make_llama
    for variant in stream ring; do
      TANDEM_DECODE_UNSPLIT=$variant TANDEM_OP_PROFILE=8 timeout 150 $S/bin/tandem bench \
        --model "$m" --quantization fp8 --kv-cache-dtype fp8 --scenarios decode \
        --batch-sizes 256 --contexts 640 --decode-tokens 40 >"$LOGS/profile_$variant.log" 2>&1
      note "profile $variant exit=$?: $(grep -E '^decode' "$LOGS/profile_$variant.log" | head -1)"
      grep -E "op profile of step .* \(256 sequences" -A14 "$LOGS/profile_$variant.log" | head -15 \
        >>"$OUT/summary.txt"
    done
    tar -C "$OUT" -czf "$OUT/logs_profile.tgz" logs && rm -rf "$LOGS"
    ;;
  bf16)
    run_test attention_gpu_test 200
    for tool in memcheck racecheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $S/tests/attention_gpu_test \
        --gtest_filter='PagedAttentionGpuTest.SmallBothPaths:PagedAttentionFp8GpuTest.SmallForSanitizer' \
        >"$LOGS/san_$tool.log" 2>&1
      note "compute-sanitizer $tool exit=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' \
        "$LOGS/san_$tool.log" | tr '\n' ' ')"
    done
    for shape in "256 640 64" "256 2048 64" "128 4096 64" "32 4096 64" "64 16384 64" \
      "128 4096 16" "32 4096 16"; do
      for variant in stream ring; do attention_one $shape bf16 $variant; done
    done
    tar -C "$OUT" -czf "$OUT/logs_bf16.tgz" logs && rm -rf "$LOGS"
    ;;
  final)
    # Ordered by what matters if the device time runs out: the helpers' GPU tests, then the FP8
    # throughput tuned and untuned (each note lands in the summary as it finishes).
    TESTS=${TESTS:-"engine_cuda_tp_test engine_cuda_quant_tp_test engine_cuda_pp_test fp8_gemm_lt_gpu_test"}
    run_named_tests 120
    grep -hE "^tuned |max \|TP - TP1\||against plain" "$LOGS"/*.log | head -30 >>"$OUT/summary.txt"
    make_llama
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_tuned TANDEM_LT_AUTOTUNE=1
    grep -E "cuBLASLt (FP8 rows|bf16 m)=256 .*: candidate" "$LOGS/bench_fp8kv_tuned.log" |
      sed 's/^.*cuBLASLt/cuBLASLt/' | head -8 >>"$OUT/summary.txt"
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_heuristic TANDEM_LT_AUTOTUNE=0
    tar -C "$OUT" -czf "$OUT/logs_final.tgz" logs && rm -rf "$LOGS"
    ;;
  tests)
    run_named_tests 240
    tar -C "$OUT" -czf "$OUT/logs_tests.tgz" logs && rm -rf "$LOGS"
    ;;
  *)
    echo "usage: $0 stream|peers|bf16|final|tests" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
