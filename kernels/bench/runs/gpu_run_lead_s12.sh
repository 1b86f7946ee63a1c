#!/bin/bash
# Session 12 lead runs (kernels/sampling/WORKLOG.md): the per-CTA phase traces of the row-pipelined
# kernel's top-p rows from several -DTANDEM_SAMPLING_TRACE builds (TRACE_BINS, default "t":
# .gpu-lead/kb_bench_<v>) at CFGS ("batch mode" pairs, comma-separated), then the interleaved A/B
# rounds of gpu_run_lead_s9.sh (ROUNDS, ROWS, TEST_BIN, SAN). Carry [".gpu-lead"].
set -o pipefail
S=${STAGE:-.gpu-lead}
export LD_LIBRARY_PATH=$PWD/$S/_libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
IFS=, read -ra cfgs <<<"${CFGS:-256 topp0.95,96 topp0.95_peaked}"
for v in ${TRACE_BINS:-t}; do
  for cfg in "${cfgs[@]}"; do
    set -- $cfg
    log="$OUT/trace_${v}_$1_$2.log"
    TANDEM_SAMPLING_TRACE_DUMP=1 TANDEM_BENCH_SAMPLING_BATCH=$1 TANDEM_BENCH_SAMPLING_MODE=$2 \
      timeout 60 $S/kb_bench_$v - sampling >"$log" 2>&1
    echo "== $v B=$1 $2: $(grep -E "^sampling\.$2 " "$log" | awk '{print $4" us"}')"
    grep "rowpipe trace" "$log" | grep -v "start offset"
  done
done
mkdir -p "$OUT/ab"
OUT=$OUT/ab TEST_BIN=${TEST_BIN:-none} NCU_MODES=none bash kernels/bench/runs/gpu_run_lead_s9.sh
