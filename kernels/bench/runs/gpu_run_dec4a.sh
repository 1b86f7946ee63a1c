#!/bin/bash
# GPU call 1 of helper "dec4" (issue #5, small-batch decode): diagnostics only, no kernel change.
# - (run 1 only) cluster occupancy of the H200: .gpu-dec4/cluster_probe, max active clusters of
#   1-16 CTAs at 100 / 204 / 220 KB of shared memory per CTA (its source is at the end of
#   kernels/bench/results/dec4_h200_run12_diag.log);
# - attention_bench `one B L page` with the default random page order and with
#   TANDEM_BENCH_CONTIGUOUS_PAGES=1 (pages in pool order), and the phase trace of both;
# - ncu source counters (warp-state samples per SASS instruction) of one warm launch of the split
#   variant at B=1 L=8k and B=1 L=1k, and of the no-split variant at B=32 L=4k page 16.
# Carried: .gpu-dec4/ = attention_bench, trace/attention_bench, _libs.
set -o pipefail
B=.gpu-dec4
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/out}
N=/tmp/dec4
mkdir -p "$OUT" $N
S=$OUT/summary.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >>$S
ncu --version | tail -1 >>$S

for shape in "1 1024 16" "1 8192 16"; do
  for sets in "" 1; do
    env ${sets:+TANDEM_BENCH_SETS=1} timeout 60 $B/attention_bench one $shape 2>&1 |
      sed "s/^RESULT/RESULT sets=${sets:-rot}/" >>$S
    env ${sets:+TANDEM_BENCH_SETS=1} timeout 60 $B/trace/attention_bench one $shape 2>&1 |
      sed "s/^/sets=${sets:-rot} /" >>$OUT/trace.log
  done
done
SI=$(ncu --help | grep -o -E -- '--(warp-)?sampling-interval' | head -1)
echo "sampling option: $SI" >>$S
prof() {  # name, launch-skip, shape...
  local name=$1 skip=$2; shift 2
  timeout 120 ncu --clock-control none --cache-control none -k regex:DecodeKernel \
    --launch-skip $skip --launch-count 1 --import-source yes ${SI:+$SI 0} \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats \
    -o $N/$name $B/attention_bench one "$@" >$N/$name.run.log 2>&1
  echo "ncu $name exit=$?" >>$S
  tail -3 $N/$name.run.log >>$S
  ncu -i $N/$name.ncu-rep --page details >>$OUT/ncu_details.txt 2>&1
  ncu -i $N/$name.ncu-rep --page source --csv --print-source sass >$N/${name}_sass.csv 2>$N/err.txt ||
    ncu -i $N/$name.ncu-rep --page source --csv >$N/${name}_sass.csv 2>>$N/err.txt
  head -c 300 $N/err.txt >>$S
  gzip -c $N/${name}_sass.csv >$OUT/${name}_sass.csv.gz
}
prof b1_8k 20 1 8192 16
prof b1_1k 20 1 1024 16
TANDEM_BENCH_SETS=1 prof b1_1k_l2 20 1 1024 16
prof b32_4k 5 32 4096 16
echo "== summary ==" ; cat $S
grep -c TRACE $OUT/trace.log; cut -c1-700 $OUT/trace.log | grep TRACE
