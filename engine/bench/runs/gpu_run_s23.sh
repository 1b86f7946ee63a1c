#!/usr/bin/env bash
# Session 23's GPU-machine calls, most important first in each, so that a call cut short still
# brings back what it finished:
#   fp8    the fused FP8 decode kernel after its fix (kernels/paged_attention/WORKLOG.md step 14):
#          the SASS check (tools/gpu/check-sass.sh), the attention GPU tests, compute-sanitizer
#          memcheck + racecheck on the small fp8 case, `attention_bench decode_fp8`; the engine's
#          and the 1P1D layout's FP8-KV tests with the fused kernel as the built-in choice; then
#          `tandem bench` throughput (256 x 128 in / 1024 out, Llama-3-8B shapes, FP8 weights
#          quantized at load) with an fp8 KV cache on each fp8 decode kernel and a bf16 cache,
#          in the same call ([quant]'s 25,000 tokens/s).
#   sweep  the users' question ([gpu-disagg]): rate sweeps with fresh prompts per point, mixed vs
#          1P1D over IPC, prefill-heavy and decode-heavy (engine/bench/gpu_run_engine.sh sweep).
#   profile  the op profile of a 256-sequence FP8 decode step and ncu of the decode attention.
#   final  the merged tree: engine GPU tests, TP = 2 on one GPU, TP = 1 bench, short-context
#          decode attention.
#   tests  named test binaries of the pack: TESTS="bin[:gtest filter] ..." (e.g. a helper's).
# Staged here (carry: [".gpu-pack23"]): PACK=.gpu-pack23 engine/bench/runs/stage_pack.sh
# Usage there: engine/bench/runs/gpu_run_s23.sh fp8|sweep|profile|final|tests
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -d .gpu-eng ] || tar -xJf .gpu-pack23/eng.tar.xz
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s23-out}
LOGS=$OUT/logs
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$LOGS" "$MODELS"
source engine/bench/runs/run_lib.sh  # note, run_test, bench_tp, ncu_decode, run_named_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$LOGS/smi.txt"

case "${1:-}" in
  fp8)
    tools/gpu/check-sass.sh $S/bin/tandem $S/tests/attention_gpu_test >"$LOGS/check_sass.txt" 2>&1
    note "check-sass exit=$?: $(grep -c clean "$LOGS/check_sass.txt") clean"
    run_test attention_gpu_test 240
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $S/tests/attention_gpu_test \
        --gtest_filter='PagedAttentionFp8GpuTest.SmallForSanitizer' >"$LOGS/san_$tool.log" 2>&1
      note "compute-sanitizer $tool exit=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' \
        "$LOGS/san_$tool.log" | tr '\n' ' ')"
    done
    timeout 150 $S/bin/attention_bench decode_fp8 >"$LOGS/attention_bench_fp8.log" 2>&1
    note "attention_bench decode_fp8 exit=$?"
    grep -E "^RESULT" "$LOGS/attention_bench_fp8.log" | sed "s/^RESULT kernel=//" |
      cut -d' ' -f1-12 >>"$OUT/summary.txt"
    run_test engine_cuda_test 200 --gtest_filter='*Fp8*'
    run_test disagg_equality_gpu_test 200 --gtest_filter='*Fp8Kv*'
    grep -hE "^disagg equality" "$LOGS"/disagg_equality_gpu_test.log >>"$OUT/summary.txt"
    tar -C "$OUT" -czf "$OUT/logs_tests.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
    m=$MODELS/llama3-8b
    /usr/bin/time -f "make-model llama3-8b: %e s" $S/bin/tandem make-model --preset llama3-8b \
      --out "$m" >"$LOGS/make_model.log" 2>&1
    note "$(tail -1 "$LOGS/make_model.log")"
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_fused
    BENCH_KV_ARGS="--kv-cache-dtype bf16" bench_tp bf16kv
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_dequant TANDEM_FP8_DECODE=dequant
    tar -C "$OUT" -czf "$OUT/logs_bench.tgz" logs && rm -rf "$LOGS"
    ;;
  sweep)
    # gpu_run_engine.sh packs and removes its own $OUT/logs: it gets a folder of its own.
    SWEEP_DEADLINE_S=${SWEEP_DEADLINE_S:-540} OUT=$OUT/sweep \
      engine/bench/gpu_run_engine.sh sweep >"$LOGS/sweep_run.txt" 2>&1
    note "sweep exit=$?"
    cat "$OUT/sweep/summary.txt" >>"$OUT/summary.txt"
    tar -C "$OUT" -czf "$OUT/logs_sweep.tgz" logs && rm -rf "$LOGS"
    ;;
  profile)
    # Where a 256-sequence FP8 decode step goes ([quant]'s 25,000 tokens/s): the op profile
    # (TANDEM_OP_PROFILE, eager, CUDA events) at 256 x context 640 (the throughput run's mean)
    # with FP8 weights + FP8 KV, and with bf16 weights + bf16 KV; then ncu of the decode
    # attention kernels at 128 x 4k (bf16 and fused fp8; [decode-tc] and the 3.8 TB/s target).
    m=$MODELS/llama3-8b
    /usr/bin/time -f "make-model llama3-8b: %e s" $S/bin/tandem make-model --preset llama3-8b \
      --out "$m" >"$LOGS/make_model.log" 2>&1
    note "$(tail -1 "$LOGS/make_model.log")"
    for cfg in "fp8:--quantization fp8 --kv-cache-dtype fp8" "bf16:--kv-cache-dtype bf16"; do
      # shellcheck disable=SC2086
      TANDEM_OP_PROFILE=8 timeout 150 $S/bin/tandem bench --model "$m" ${cfg#*:} \
        --scenarios decode --batch-sizes 256 --contexts 640 --decode-tokens 40 \
        >"$LOGS/profile_${cfg%%:*}.log" 2>&1
      note "profile ${cfg%%:*} exit=$?: $(grep -E '^decode' "$LOGS/profile_${cfg%%:*}.log" | head -1)"
      grep -E "op profile" -A40 "$LOGS/profile_${cfg%%:*}.log" | head -45 >>"$OUT/summary.txt"
    done
    for kv in bf16 fused; do
      ncu_decode $kv 128 4096 16 $kv \
        "DRAM Throughput|Memory Throughput|Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Achieved Occupancy|Stall" \
        SpeedOfLight MemoryWorkloadAnalysis WarpStateStats SchedulerStats Occupancy LaunchStats
    done
    tar -C "$OUT" -czf "$OUT/logs_profile.tgz" logs && rm -rf "$LOGS"
    ;;
  final)
    # The merged tree: the engine's GPU tests (TP = 1 after the TP changes), the TP = 2 test on
    # one GPU (TESTS, e.g. "engine_cuda_tp_test"), `tandem bench` latency + throughput at TP = 1
    # against run 29's numbers, then the decode attention at short contexts (the 256-sequence
    # FP8 step of `profile` spent 44% in attention at 2.2 TB/s) with ncu of the fused kernel.
    run_named_tests 120
    run_test engine_cuda_test 180
    m=$MODELS/llama3-8b
    /usr/bin/time -f "make-model llama3-8b: %e s" $S/bin/tandem make-model --preset llama3-8b \
      --out "$m" >"$LOGS/make_model.log" 2>&1
    note "$(tail -1 "$LOGS/make_model.log")"
    timeout 150 $S/bin/tandem bench --model "$m" --scenarios latency,throughput \
      --json "$LOGS/bench_tp1.json" >"$LOGS/bench_tp1.log" 2>&1
    note "bench tp1 exit=$?: $(grep -E '^(latency|throughput)' "$LOGS/bench_tp1.log" | tr '\n' ' ')"
    # The fused kernel's three-CTA variant (TANDEM_FP8_FUSED_CTAS=3, WORKLOG.md step 15): its
    # correctness first, then every shape on bf16, dequant, fused (2 CTAs) and fused (3 CTAs).
    TANDEM_FP8_FUSED_CTAS=3 TAG=_ctas3 run_test attention_gpu_test 200 \
      --gtest_filter='PagedAttentionFp8GpuTest.*'
    for shape in "256 640 16" "256 1024 16" "256 2048 16" "64 640 16" "128 4096 16" "32 4096 16"; do
      for kv in bf16 dequant fused fused3; do
        f=$LOGS/short_${shape// /_}_$kv.log
        if [ $kv = fused3 ]; then
          TANDEM_FP8_FUSED_CTAS=3 timeout 60 $S/bin/attention_bench one $shape fused >"$f" 2>&1
        else
          timeout 60 $S/bin/attention_bench one $shape $kv >"$f" 2>&1
        fi
        note "attention one $shape $kv: $(grep -m1 -oE ' us=[0-9.]+ TBps=[0-9.]+.*graph_us=[0-9.]+ graph_TBps=[0-9.]+' \
          "$f" | cut -d' ' -f2-3,5-7)"
      done
    done
    for kv in bf16 fused fused3; do
      ctas=2
      [ $kv = fused3 ] && ctas=3
      NCU_ENV="TANDEM_FP8_FUSED_CTAS=$ctas" ncu_decode short_$kv 256 640 16 ${kv%3} \
        "DRAM Throughput|Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Achieved Occupancy" \
        SpeedOfLight WarpStateStats SchedulerStats Occupancy LaunchStats
    done
    tar -C "$OUT" -czf "$OUT/logs_final.tgz" logs && rm -rf "$LOGS"
    ;;
  tests)
    run_named_tests 240
    tar -C "$OUT" -czf "$OUT/logs_tests.tgz" logs && rm -rf "$LOGS"
    ;;
  *)
    echo "usage: $0 fp8|sweep|profile|final|tests" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
