#!/bin/bash
# Lead runs T1-T7 and P (session 8): top-p-only rows in the row-pipelined sampling kernel
# (sampling_rowpipe.cu, two passes). Every GPU test binary (the attention and RoPE tests also
# check the per-device launch_config.cuh refactor on a GPU), memcheck and racecheck on the small
# all-paths sampling batch, then kb_bench's sampling section; NCU=1 adds ncu of the row-pipelined
# kernel at B = 256 for NCU_MODES (default topp0.95). Knobs: TESTS (test binaries; "none"
# skips them), SAN=0 (no sanitizers), BENCH_BATCH (time only the default dispatch at that batch),
# BENCH_ROWS (a regex of the bench rows to print). Stage with kernels/bench/stage_gpu.sh <build>
# .gpu-lead; carry [".gpu-lead"].
set -o pipefail
B=${STAGE:-.gpu-lead}
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for t in ${TESTS:-kernels_kb_gpu_test attention_gpu_test attention_prefill_gpu_test}; do
  [ -x "$B/$t" ] || continue
  timeout 240 $B/$t >"$OUT/$t.log" 2>&1
  echo "$t exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|rounding mismatch" "$OUT/$t.log" | head -20
done
if [ "${SAN:-1}" = 1 ]; then
  : >"$OUT/sanitizer.log"
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/kernels_kb_gpu_test \
      --gtest_filter='SamplingCudaTest.SmallBatchAllPaths' >"$OUT/san.tmp" 2>&1
    echo "$tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/san.tmp" | sort | uniq -c | tr '\n' ' ')"
    cat "$OUT/san.tmp" >>"$OUT/sanitizer.log"
  done
  rm -f "$OUT/san.tmp"
fi
[ -n "${BENCH_BATCH:-}" ] && export TANDEM_BENCH_SAMPLING_BATCH=$BENCH_BATCH
timeout 200 $B/kb_bench "$OUT/kb_bench.jsonl" sampling >"$OUT/kb_bench.log" 2>&1
echo "kb_bench exit=$?"
echo "== sampling, us (x read) =="
grep -E "^sampling" "$OUT/kb_bench.log" | grep -E "${BENCH_ROWS:-.}" |
  awk '{printf "%-40s %-6s %9s us %7s x\n", $1, $2, $4, $6}'
unset TANDEM_BENCH_SAMPLING_BATCH
if [ "${NCU:-0}" = 1 ]; then
  for mode in ${NCU_MODES:-topp0.95}; do
    TANDEM_BENCH_SAMPLING_BATCH=256 TANDEM_BENCH_SAMPLING_MODE=$mode timeout 150 ncu \
      --clock-control none -k regex:RowPipe -s 3 -c 1 --set full --import-source yes \
      -o "$OUT/ncu_$mode" $B/kb_bench - sampling >"$OUT/ncu_$mode.log" 2>&1
    ncu -i "$OUT/ncu_$mode.ncu-rep" --page details >"$OUT/ncu_${mode}_details.txt" 2>&1
    ncu -i "$OUT/ncu_$mode.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/ncu_${mode}_sass.csv" 2>&1
    rm -f "$OUT/ncu_$mode.ncu-rep" "$OUT/ncu_$mode.log"
    echo "ncu $mode: $(grep -E 'Duration|Memory Throughput|DRAM Throughput|L2 Hit Rate|Registers Per|Achieved Occupancy|Warp Cycles Per Issued' "$OUT/ncu_${mode}_details.txt" | tr -s ' ' | tr '\n' ';')"
  done
fi
