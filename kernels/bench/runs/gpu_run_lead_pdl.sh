#!/bin/bash
# Lead run H (session 6): the decode attention with programmatic dependent launch
# (PagedAttentionArgs::overlap_launch). All attention GPU tests (new: DecodeAfterRopeKvStoreWithPdl),
# memcheck and racecheck on the small decode tests and the new one, then `attention_bench decode`
# twice: per shape the stream time, the graph chain with PDL (graph_us) and plain
# (graph_plain_us), and RopeKvStore -> attention pairs with and without PDL.
# Staged here: .gpu-lead/{attention_gpu_test,attention_bench,_libs}.
set -o pipefail
B=.gpu-lead
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 150 $B/attention_gpu_test >"$OUT/tests.log" 2>&1
echo "attention_gpu_test exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" "$OUT/tests.log" | head -10
F='PagedAttentionGpuTest.SmallBothPaths:PagedAttentionGpuTest.DecodeAwkwardLengths:PagedAttentionGpuTest.DecodeAfterRopeKvStoreWithPdl'
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_gpu_test \
    --gtest_filter=$F >"$OUT/san_$tool.log" 2>&1
  echo "compute-sanitizer $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
for round in 1 2; do
  timeout 120 $B/attention_bench decode 2>&1 | sed "s/^RESULT/R$round/" >>"$OUT/bench.log"
done
echo "== decode: stream us | graph PDL / plain us | RopeKvStore+attention pair PDL / plain us =="
grep -E "^R[12] kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ ips=default//; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ items=[^ ]+ merges=[^ ]+//' | sort -s -t' ' -k2,4
