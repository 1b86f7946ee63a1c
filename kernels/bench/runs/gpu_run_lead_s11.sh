#!/bin/bash
# Session 11 lead run W1 (kernels/sampling/WORKLOG.md): which of pass 1's chunks a top-p row
# keeps in L2 for pass 2. Stage .gpu-lead/ with kb_bench (a: the session's start), kb_bench_b
# (the kept chunks evict-normal, the rest evict-first; TANDEM_EXP_KEEP_PCT = the share of the L2
# they may take, 10000 = every chunk, a's policy), kb_bench_c (b, the kept chunks evict-last),
# kb_bench_d (b + the candidate append re-reading the stage) and kernels_kb_gpu_test_d.
# TANDEM_EXP_KEEP_PCT was read by the experiment builds only (the committed policy keeps 2/3).
# Knobs: TEST_BIN (none skips), SAN=0, NCU=0. Logs in $OUT/logs.tgz.
set -o pipefail
source kernels/bench/runs/lead_tests.sh  # S (the stage), the environment, OUT
lead_tests "${TEST_BIN:-kernels_kb_gpu_test_d}"
one() {  # one <bin> <pct> <batch> <mode>: prints "<bin> pct=<pct> B=<batch> <mode> <us>"
  local bin=$S/kb_bench
  [ "$1" != a ] && bin=$S/kb_bench_$1
  TANDEM_EXP_KEEP_PCT=$2 TANDEM_BENCH_SAMPLING_BATCH=$3 TANDEM_BENCH_SAMPLING_MODE=$4 \
    timeout 60 $bin - sampling >"$OUT/one.log" 2>&1
  echo "$1 pct=$2 B=$3 $4 $(grep -E "^sampling\.$4 " "$OUT/one.log" | awk '{print $4}')"
  cat "$OUT/one.log" >>"$OUT/one_all.log"
}
echo "== top-p 0.95, B = 256, default dispatch, us (two rounds)"
for round in 1 2; do
  one a 0 256 topp0.95
  for p in 10000 0 33 50 67 85 100; do one b $p 256 topp0.95; done
  for p in 33 50 67; do one c $p 256 topp0.95; done
  one d 67 256 topp0.95
done
echo "[${SECONDS}s] == other batches and modes"
for B in 128 192; do
  for cfg in "a 0" "b 10000" "b 67" "c 50" "d 67"; do one $cfg $B topp0.95; done
done
for cfg in "a 0" "b 67" "d 67"; do one $cfg 256 topp0.999; one $cfg 256 temp0.7; done
if [ "${NCU:-1}" = 1 ]; then
  for cfg in "b 10000" "b 67" "c 50"; do
    set -- $cfg
    TANDEM_EXP_KEEP_PCT=$2 TANDEM_BENCH_SAMPLING_BATCH=256 TANDEM_BENCH_SAMPLING_MODE=topp0.95 \
      timeout 150 ncu --clock-control none -k regex:RowPipe -s 3 -c 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section SchedulerStats $S/kb_bench_$1 - sampling \
      >"$OUT/ncu_$1_$2.txt" 2>&1
    echo "[${SECONDS}s] ncu $cfg: $(grep -E ' Duration|DRAM Throughput|L2 Hit Rate |Issue Slots Busy' "$OUT/ncu_$1_$2.txt" | tr -s ' ' | tr '\n' ';')"
  done
fi
rm -f "$OUT/one.log"
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '^logs.tgz$'))
