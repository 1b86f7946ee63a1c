#!/bin/bash
# Lead runs L1-L5 (session 7): the row-pipelined sampling kernel (sampling_rowpipe.cu). All
# kernels_kb_gpu_test tests (every sampling variant, the row-pipelined kernel forced at every
# batch among them), memcheck and racecheck on the small all-paths sampling batch, then kb_bench's
# sampling section (default dispatch, both first kernels forced, B = 1 / 32 / 128 / 192 / 256);
# NCU=1 adds ncu of the kernel at B = 256 (NCU_MODES, default top-k 50 + top-p 0.9 and greedy).
set -o pipefail
B=${STAGE:-.gpu-lead}
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 240 $B/kernels_kb_gpu_test >"$OUT/tests.log" 2>&1
echo "kernels_kb_gpu_test exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure|rounding mismatch" "$OUT/tests.log" | head -20
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/kernels_kb_gpu_test \
    --gtest_filter='SamplingCudaTest.SmallBatchAllPaths' >"$OUT/$tool.log" 2>&1
  echo "$tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | sort | uniq -c | tr '\n' ' ')"
done
timeout 200 $B/kb_bench "$OUT/kb_bench.jsonl" sampling >"$OUT/kb_bench.log" 2>&1
echo "kb_bench exit=$?"
echo "== sampling, us (x read) =="
grep -E "^sampling" "$OUT/kb_bench.log" | awk '{printf "%-40s %-6s %9s us %7s x\n", $1, $2, $4, $6}'
# ncu of the row-pipelined kernel at B = 256 (the default dispatch there): the top-k 50 + top-p 0.9
# and greedy rows, full set with source-level warp-state samples (SASS page as CSV).
if [ "${NCU:-0}" = 1 ]; then
  for mode in ${NCU_MODES:-topk50_topp0.9 greedy}; do
    TANDEM_BENCH_SAMPLING_BATCH=256 TANDEM_BENCH_SAMPLING_MODE=$mode timeout 150 ncu \
      --clock-control none -k regex:RowPipe -s 3 -c 1 --set full --import-source yes \
      -o "$OUT/ncu_$mode" $B/kb_bench - sampling >"$OUT/ncu_$mode.log" 2>&1
    ncu -i "$OUT/ncu_$mode.ncu-rep" --page details >"$OUT/ncu_${mode}_details.txt" 2>&1
    ncu -i "$OUT/ncu_$mode.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/ncu_${mode}_sass.csv" 2>&1
    rm -f "$OUT/ncu_$mode.ncu-rep"
    echo "ncu $mode: $(grep -E 'Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued' "$OUT/ncu_${mode}_details.txt" | tr -s ' ' | tr '\n' ';')"
  done
fi
# Run L5 also timed kCandTrigger 1024 / 512 / 256 through a temporary environment switch (removed
# after it: 1024 was fastest; kernels/sampling/WORKLOG.md, session 7).
