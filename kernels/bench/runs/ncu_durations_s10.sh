#!/bin/bash
# Per-kernel durations (ncu) of the default sampling dispatch: which kernel holds the top-p gap.
S=.gpu-lead
source tools/gpu/gpu-env.sh --libs "$PWD/$S/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for b in 128 256; do for mode in topp0.95 greedy; do
  TANDEM_BENCH_SAMPLING_BATCH=$b TANDEM_BENCH_SAMPLING_MODE=$mode timeout 120 ncu --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum -k regex:Sampling -s 10 -c 12 --csv $S/kb_bench_f - sampling > $OUT/ncu_${mode}_$b.csv 2>&1
  echo "== B=$b $mode"
  grep gpu__time_duration $OUT/ncu_${mode}_$b.csv | awk -F'","' '{n=$5; gsub(/\(anonymous namespace\)::/,"",n); sub(/\(.*/,"",n); gsub(/ /,"_",n); print n, $NF}' | tr -d '"' | sort | awk '{k=$1; v[k]=v[k]" "$2} END {for (k in v) print k, v[k]}'
done; done
