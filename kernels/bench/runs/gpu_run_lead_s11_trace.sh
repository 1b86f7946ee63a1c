#!/bin/bash
# Lead runs with the row-pipelined kernel's top-p phase trace (kernels/sampling/WORKLOG.md:
# session 11, runs W2-W5; session 12, runs Z2-Z5): the phases of its top-p rows per CTA (pass 1,
# band, pass 2, tail) from each of TRACE_BINS (default "t": .gpu-lead/kb_bench_<v>, kb_bench
# built with -DTANDEM_SAMPLING_TRACE; a #define at the top of sampling_rowpipe.cu will do) at
# CFGS ("batch mode" pairs, comma-separated; default B = 256 / 128 / 192), then the interleaved
# A/B rounds of gpu_run_lead_s9.sh (ROUNDS, ROWS, TEST_BIN, SAN; kb_bench_<v> staged beside
# kb_bench in .gpu-lead/). Carry [".gpu-lead"].
set -o pipefail
S=${STAGE:-.gpu-lead}
source tools/gpu/gpu-env.sh --libs "$PWD/$S/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
IFS=, read -ra cfgs <<<"${CFGS:-256 topp0.95,256 topp0.999,128 topp0.95,192 topp0.95}"
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
