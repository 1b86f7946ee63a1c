#!/usr/bin/env bash
# Locates the fused FP8 decode kernel's illegal-instruction fault (kernels/paged_attention/
# WORKLOG.md step 13, run 27): every fp8 GPU test in a process of its own (the error is sticky,
# so one process per test says which ones fault), then compute-sanitizer on the small case and on
# the first shapes seen to fault (memcheck reports the faulting PC and source line; synccheck
# reports warp-synchronous instructions run by a diverged warp), then `attention_bench
# one B L page fused` in a process of its own per shape.
# Stage here (~20 MB with the libraries; carry: [".gpu-fp8san"]):
#   cmake --build build -j2 --target attention_gpu_test attention_bench
#   mkdir -p .gpu-fp8san && cp build/tests/attention_gpu_test build/bin/attention_bench .gpu-fp8san/
#   tools/gpu/bundle-libs.sh .gpu-fp8san/_libs .gpu-fp8san/attention_*
# Usage there: kernels/bench/runs/gpu_run_fp8san.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
S=${STAGE:-.gpu-fp8san}
source tools/gpu/gpu-env.sh --libs "$PWD/$S/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/fp8san-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
: >"$OUT/summary.txt"
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv >"$LOGS/smi.txt"
T=$S/attention_gpu_test
for t in DecodeAwkwardShapes SmallForSanitizer DecodeSeveralQueriesPerSequence \
  DecodeMagnitudesFarFromOne DecodeDefaultKernel DecodeAfterRopeKvStoreWithPdl \
  PrefillChunksOverCachedPages; do
  timeout 120 $T --gtest_filter="PagedAttentionFp8GpuTest.$t" >"$LOGS/test_$t.log" 2>&1
  note "$t exit=$?: $(grep -cE 'Failure$' "$LOGS/test_$t.log") failures; first: \
$(grep -m1 -E 'fp8 decode kernel|Which is' "$LOGS/test_$t.log")"
done
for tool in memcheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --show-backtrace device --print-limit 20 \
    --error-exitcode 9 $T --gtest_filter='PagedAttentionFp8GpuTest.SmallForSanitizer' \
    >"$LOGS/san_${tool}_small.log" 2>&1
  note "compute-sanitizer $tool small exit=$?: $(grep -hE 'ERROR SUMMARY' "$LOGS/san_${tool}_small.log")"
  grep -m3 -A8 -E "^========= (Illegal|Invalid|Barrier|Warp|.*divergent)" \
    "$LOGS/san_${tool}_small.log" >>"$OUT/summary.txt"
done
# The first case seen to fault (page 1, split plan, generic copies) under memcheck.
timeout 200 compute-sanitizer --tool memcheck --show-backtrace device --print-limit 20 \
  --error-exitcode 9 $T --gtest_filter='PagedAttentionFp8GpuTest.DecodeAwkwardShapes' \
  >"$LOGS/san_memcheck_awkward.log" 2>&1
note "compute-sanitizer memcheck awkward exit=$?: $(grep -hE 'ERROR SUMMARY' "$LOGS/san_memcheck_awkward.log")"
grep -m3 -A8 -E "^========= (Illegal|Invalid|Warp|Barrier)" "$LOGS/san_memcheck_awkward.log" \
  >>"$OUT/summary.txt"
# The bench's shapes one process each (a fault ends only its own shape), fused kernel.
for shape in "32 4096 16" "32 4096 64" "64 4096 64" "1 8192 16" "1 8192 64" "8 4096 16" \
  "32 4096 7" "32 4096 1"; do
  timeout 60 $S/attention_bench one $shape fused >"$LOGS/bench_${shape// /_}.log" 2>&1
  note "attention_bench one $shape fused exit=$?: $(grep -m1 -oE 'us=[0-9.]+ TBps=[0-9.]+' \
"$LOGS/bench_${shape// /_}.log") $(grep -m1 -oE 'CHECK failed.*' "$LOGS/bench_${shape// /_}.log")"
done
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$LOGS"
cat "$OUT/summary.txt"
