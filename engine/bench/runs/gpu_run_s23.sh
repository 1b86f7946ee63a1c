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
#   tests  named test binaries of the pack: TESTS="bin[:gtest filter] ..." (e.g. a helper's).
# Staged here (carry: [".gpu-pack23"]): engine/bench/runs/stage_s23.sh
# Usage there: engine/bench/runs/gpu_run_s23.sh fp8|sweep|tests
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
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
run_test() {  # name timeout [args...]
  local t=$1 limit=$2
  shift 2
  timeout "$limit" $S/tests/$t "$@" >"$LOGS/$t${TAG:-}.log" 2>&1
  note "$t${TAG:-} exit=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' \
    "$LOGS/$t${TAG:-}.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure$" -A3 "$LOGS/$t${TAG:-}.log" | head -24 >>"$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$LOGS/smi.txt"

bench_tp() {  # tag [env...]: tandem bench throughput on $m with FP8 weights
  local tag=$1
  shift
  env "$@" timeout 150 $S/bin/tandem bench --model "$m" --quantization fp8 \
    --scenarios throughput --json "$LOGS/bench_$tag.json" ${BENCH_KV_ARGS:-} \
    >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^throughput' "$LOGS/bench_$tag.log" | head -2 | tr '\n' ' ')"
  grep -E "KV cache|captured" "$LOGS/bench_$tag.log" | head -2 >>"$OUT/summary.txt"
}

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
  tests)
    for spec in ${TESTS:-}; do
      if [[ $spec == *:* ]]; then
        run_test "${spec%%:*}" 240 --gtest_filter="${spec#*:}"
      else
        run_test "$spec" 240
      fi
    done
    tar -C "$OUT" -czf "$OUT/logs_tests.tgz" logs && rm -rf "$LOGS"
    ;;
  *)
    echo "usage: $0 fp8|sweep|tests" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
