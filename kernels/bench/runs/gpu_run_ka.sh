#!/bin/bash
# One GPU-machine run for the attention kernels (paged attention, RoPE/KV-store): GPU tests,
# compute-sanitizer memcheck + racecheck on small shapes, the benchmark with its ceilings, the
# PyTorch peer, a SASS summary; logs under $OUT, a short table last.
# Carried: .gpu-ka/ (attention_gpu_test, attention_bench, _libs from tools/gpu/bundle-libs.sh).
# Optional first argument: "quick" skips the sanitizers; "ncu" adds an Nsight Compute profile of
# one decode (B=32, L=4k) and one prefill (L=16k) launch.
set -o pipefail
B=.gpu-ka
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv | tee "$OUT/smi.txt"
timeout 240 $B/attention_gpu_test 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED)|Failure|error" | head -40
if [ "$1" != quick ]; then
  SMALL='PagedAttentionGpuTest.SmallBothPaths:RopeKvStoreGpuTest.Qwen3QkNorm'
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_gpu_test \
      --gtest_filter=$SMALL > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | head -2 | tr '\n' ' ')"
  done
fi
(cuobjdump --dump-resource-usage $B/attention_bench 2>&1 | grep -A1 -E "Decode|Prefill|Combine|Rope" | grep -E "Function|REG";
 cuobjdump --dump-sass $B/attention_bench > /tmp/sass.txt 2>&1;
 echo "SASS: HMMA $(grep -c HMMA /tmp/sass.txt) LDSM $(grep -c LDSM /tmp/sass.txt) LDGSTS $(grep -c LDGSTS /tmp/sass.txt) LDL/STL $(grep -cE 'LDL|STL' /tmp/sass.txt)") > "$OUT/sass_summary.txt" 2>&1
timeout 200 $B/attention_bench 2>&1 | tee "$OUT/bench.log"
timeout 150 python3 kernels/bench/attention_peer.py 2>&1 | tee -a "$OUT/bench.log"
# Plan setting check at small batch: two items per resident CTA instead of one.
TANDEM_DECODE_ITEMS_PER_SLOT=2 timeout 60 $B/attention_bench small 2>&1 | grep RESULT | sed 's/^RESULT/SMALL/' | tee -a "$OUT/bench.log" | cut -c1-120
if [ "$1" = ncu ]; then
  for k in DecodeKernel PrefillKernel; do
    timeout 120 ncu --clock-control none -k regex:$k -c 1 --section SpeedOfLight \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section Occupancy $B/attention_bench ncu > "$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k exit=$?: $(grep -E 'Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issue Slots Busy' "$OUT/ncu_$k.txt" | tr -s ' ' | tr '\n' ';')"
  done
fi
tail -1 "$OUT/sass_summary.txt"
python3 kernels/bench/attention_table.py "$OUT/bench.log"
