#!/bin/bash
# Final GPU call of helper "dec4" (issue #5): the committed decode kernel (.gpu-dec4/attention_bench,
# attention_gpu_test) against the kernel of the commit before it (.gpu-dec4/base/attention_bench):
# every attention GPU test, compute-sanitizer memcheck + racecheck on the small decode shapes,
# `attention_bench decode` of both, interleaved, two rounds, and the phase trace at B=1.
set -o pipefail
B=.gpu-dec4
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/out}
N=/tmp/dec4
mkdir -p "$OUT" $N
S=$OUT/summary.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >>$S
timeout 150 $B/attention_gpu_test >"$OUT/tests.log" 2>&1
echo "attention_gpu_test (all) exit=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$OUT/tests.log" | tr '\n' ' ')" >>$S
grep -E "^\[  FAILED|Failure|error:" "$OUT/tests.log" | head -10 >>$S
SMALL='PagedAttentionGpuTest.SmallBothPaths:PagedAttentionGpuTest.DecodeAwkwardLengths:PagedAttentionGpuTest.DecodeCombineInBatches:PagedAttentionGpuTest.DecodeSmallAndOddPageSizes'
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_gpu_test \
    --gtest_filter=$SMALL >"$N/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests? ran' "$N/sanitizer_$tool.log" | tr '\n' ' ')" >>$S
  cat "$N/sanitizer_$tool.log" >>"$OUT/tests.log"
done
for round in 1 2; do
  timeout 120 $B/attention_bench decode 2>&1 | sed "s/^RESULT/NEW$round/" >>"$OUT/bench.log"
  timeout 120 $B/base/attention_bench decode 2>&1 | sed "s/^RESULT/BASE$round/" >>"$OUT/bench.log"
done
timeout 60 $B/trace/attention_bench one 1 8192 16 2>&1 | grep TRACE >>$OUT/trace.log
cat $S
cut -c1-520 $OUT/trace.log
grep -E "kernel=ceiling" "$OUT/bench.log"
grep -E "kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ ips=default//; s/ items=.*//' | sort -s -t' ' -k2,4
