#!/bin/bash
# GPU call 4 of helper "dec4" (issue #5): the decode kernel of this tree (.gpu-dec4/attention_bench,
# "v2": block-table entries per lane with lean chunk addresses, compact split combine) against
# the previous kernel (base/) and the first version of the copy change (v1/), interleaved, two
# rounds each (`attention_bench decode`: copy ceiling + every decode shape of the full run); the
# split variant with and without its evict-first hint (TANDEM_DECODE_SPLIT_HINT=0, `small`);
# every attention GPU test, memcheck + racecheck on the small decode shapes; the phase trace of
# this tree and base; ncu source counters of this tree at B=1 L=8k; SASS instruction counts.
# (v1/ and the TANDEM_DECODE_SPLIT_HINT switch existed for this run only: WORKLOG.md step 9.)
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
TANDEM_DECODE_SPLIT_HINT=0 timeout 100 $B/attention_gpu_test --gtest_filter='*Decode*:*Small*:*Graph*' >"$N/nohint.log" 2>&1
echo "attention_gpu_test decode, split hint off exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$N/nohint.log" | tr '\n' ' ')" >>$S
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
  timeout 120 $B/v1/attention_bench decode 2>&1 | sed "s/^RESULT/V1_$round/" >>"$OUT/bench.log"
done
for round in 1 2; do
  timeout 60 $B/attention_bench small 2>&1 | sed "s/^RESULT/HINT$round/" >>"$OUT/bench.log"
  TANDEM_DECODE_SPLIT_HINT=0 timeout 60 $B/attention_bench small 2>&1 | sed "s/^RESULT/NOHINT$round/" >>"$OUT/bench.log"
done
for bin in trace/attention_bench base/attention_bench_trace; do
  for shape in "1 1024 16" "1 8192 16" "8 4096 16"; do
    timeout 60 $B/$bin one $shape 2>&1 | grep TRACE | sed "s#^#$bin #" >>$OUT/trace.log
  done
done
cuobjdump -sass $B/attention_bench 2>/dev/null | awk '/Function : .*DecodeKernel/{p=1} /Function : /&&!/DecodeKernel/{p=0} p' | gzip >$OUT/decode_sass.txt.gz
zcat $OUT/decode_sass.txt.gz | awk '/Function :/{f=$3} /LDGSTS|SHFL|HMMA|LDG|BAR/{n[f" "$2]++} END{for(k in n) print n[k], k}' | sort -k2 | grep -E "LDGSTS|SHFL" >>$S
timeout 100 ncu --clock-control none --cache-control none -k regex:DecodeKernel --launch-skip 20 \
  --launch-count 1 --import-source yes --warp-sampling-interval 0 --section SourceCounters \
  --section WarpStateStats --section SpeedOfLight -o $N/v2_b1_8k $B/attention_bench one 1 8192 16 >$N/ncu.log 2>&1
echo "ncu exit=$?" >>$S
ncu -i $N/v2_b1_8k.ncu-rep --page details >$OUT/ncu_details.txt 2>&1
ncu -i $N/v2_b1_8k.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip >$OUT/v2_b1_8k_sass.csv.gz
cat $S
echo "== trace (us after the first CTA entry: e1 item read, e2 first tile in smem, e3 last tile done, e6 combined) =="
cut -c1-520 $OUT/trace.log
echo "== decode: NEW = this tree, BASE = previous kernel, V1 = first copy change; stream us, TB/s, graph us =="
grep -E "kernel=ceiling" "$OUT/bench.log"
grep -E "kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ ips=default//; s/ items=.*//' | sort -s -t' ' -k2,4
