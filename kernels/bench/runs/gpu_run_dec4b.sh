#!/bin/bash
# GPU call of helper "dec4" (issue #5): one decode-kernel change A/B'd against the commit before it.
# Every attention GPU test, compute-sanitizer memcheck + racecheck on the small decode shapes,
# `attention_bench decode` (copy ceiling + every decode shape of the full run) of this tree
# (.gpu-dec4/attention_bench) and of the previous kernel (.gpu-dec4/base/attention_bench) in the
# same call, interleaved, two rounds each, the SDPA peer, the phase trace of both
# (-DTANDEM_DECODE_TRACE builds: trace/attention_bench, base/attention_bench_trace), and ncu
# source counters of the new kernel at B=1 L=1k and B=32 L=4k page 16. Logs under $OUT, a short
# table last. Carried: .gpu-dec4/ (binaries + _libs, tools/gpu/bundle-libs.sh).
set -o pipefail
B=.gpu-dec4
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
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
(cd kernels/bench && timeout 120 python3 - <<'PY'
import attention_peer as ap
for b, l in [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 4096), (64, 4096), (256, 1024)]:
    ap.decode(b, l)
PY
) >>"$OUT/bench.log" 2>&1
for bin in trace/attention_bench base/attention_bench_trace; do
  for shape in "1 1024 16" "1 8192 16" "32 4096 16"; do
    timeout 60 $B/$bin one $shape 2>&1 | grep TRACE | sed "s#^#$bin #" >>$OUT/trace.log
  done
done
prof() {  # name, launch-skip, shape...
  local name=$1 skip=$2; shift 2
  timeout 100 ncu --clock-control none --cache-control none -k regex:DecodeKernel \
    --launch-skip $skip --launch-count 1 --import-source yes --warp-sampling-interval 0 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    -o $N/$name $B/attention_bench one "$@" >$N/$name.run.log 2>&1
  echo "ncu $name exit=$?" >>$S
  ncu -i $N/$name.ncu-rep --page details >>$OUT/ncu_details.txt 2>&1
  ncu -i $N/$name.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip >$OUT/${name}_sass.csv.gz
}
prof new_b1_1k 20 1 1024 16
prof new_b32_4k 5 32 4096 16
cat $S
echo "== trace (us after the first CTA entry: e1 item read, e2 first tile in smem, e3 last tile done, e6 combined) =="
cut -c1-520 $OUT/trace.log
echo "== decode: NEW<round> = this tree, BASE<round> = previous kernel; stream us, TB/s, graph us =="
grep -E "^(NEW|BASE)[12] kernel=ceiling" "$OUT/bench.log"
grep -E "^(NEW|BASE)[12] kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ ips=default//; s/ items=.*//' | sort -s -t' ' -k2,4
grep -E "^PEER kernel=decode" "$OUT/bench.log"
