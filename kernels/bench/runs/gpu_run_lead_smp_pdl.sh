#!/bin/bash
# Lead run K (session 6): the resident sampling kernel launched with PDL after the streaming
# kernel (B, this tree) against the previous dispatch (A, .gpu-lead/a = run J's kb_bench). All
# kernels_kb_gpu_test tests and memcheck on the small all-paths sampling batch with B, then the
# default dispatch's sampling rows at B = 1, 32, 256 (TANDEM_BENCH_SAMPLING_BATCH), A B A B.
set -o pipefail
B=.gpu-lead
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 200 $B/kernels_kb_gpu_test >"$OUT/tests.log" 2>&1
echo "kernels_kb_gpu_test exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" "$OUT/tests.log" | head -10
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/kernels_kb_gpu_test \
  --gtest_filter='SamplingCudaTest.SmallBatchAllPaths' >"$OUT/memcheck.log" 2>&1
echo "memcheck exit=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
for batch in 1 32 256; do
  for round in 1 2; do
    TANDEM_BENCH_SAMPLING_BATCH=$batch timeout 60 $B/a/kb_bench - sampling 2>&1 | sed "s/^/A$round /" >>"$OUT/bench.log"
    TANDEM_BENCH_SAMPLING_BATCH=$batch timeout 60 $B/kb_bench - sampling 2>&1 | sed "s/^/B$round /" >>"$OUT/bench.log"
  done
done
echo "== sampling (default dispatch, engine hint), us: A = previous dispatch, B = resident kernel with PDL =="
grep -E "^[AB][12] sampling\.(greedy|temp|topk|topp)" "$OUT/bench.log" | awk '{print $2, $3, $1, $5}' | sort -s -k2,2 -k1,1
