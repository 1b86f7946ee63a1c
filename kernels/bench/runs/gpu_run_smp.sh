#!/usr/bin/env bash
# Runs on the GPU machine (see tools/gpu/README.md) for the sampling kernels: the sampling
# GPU tests (every kernel against SamplingRef), compute-sanitizer memcheck on a small batch, ncu on
# the cluster kernel at B = 256, kb_bench's sampling rows (default dispatch and the one-block-per-
# row kernel) and the PyTorch peer; full logs under $OUT, the table printed last.
# Built here first:  cmake --build build-smp --target kernels_kb_gpu_test kb_bench, then
#   mkdir -p .gpu-smp && cp build-smp/tests/kernels_kb_gpu_test build-smp/bin/kb_bench .gpu-smp/ &&
#   tools/gpu/bundle-libs.sh .gpu-smp/_libs .gpu-smp/kernels_kb_gpu_test .gpu-smp/kb_bench
# Usage there: kernels/bench/runs/gpu_run_smp.sh [all|test|sanitize|profile|bench] [gtest filter]
# (all = test, profile, bench; the sanitizer runs only when asked for).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source tools/gpu/gpu-env.sh --libs "$PWD/.gpu-smp/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smp-out}
mkdir -p "$OUT"
what=${1:-all}
filter=${2:-SamplingCudaTest.*}
bin=.gpu-smp
if [[ $what == test || $what == all ]]; then
  timeout 100 $bin/kernels_kb_gpu_test --gtest_filter="$filter" >"$OUT/smp_test.log" 2>&1
  rc=$?
  echo "tests rc=$rc"
  grep -E "^\[  (PASSED|FAILED) |^\[       OK|FAILED|Failure|mismatch" "$OUT/smp_test.log" | head -40
  [[ $rc == 124 ]] && { echo "tests timed out (a hang?): stopping"; tail -5 "$OUT/smp_test.log"; exit 1; }
fi
if [[ $what == sanitize ]]; then
  timeout 120 compute-sanitizer --tool memcheck $bin/kernels_kb_gpu_test \
    --gtest_filter='SamplingCudaTest.SmallBatchAllPaths:SamplingCudaTest.GreedyTies*' \
    >"$OUT/smp_sanitizer.log" 2>&1
  echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/smp_sanitizer.log" | head -1)"
fi
if [[ $what == profile || $what == all ]]; then
  # The default dispatch at B = 256 (both kernels launched per call, each skipping the other's
  # rows), invocations 41 / 76 / 111 of each kernel (5 warm-up + 30 timed per mode): temp0.7,
  # topk50_topp0.9, topp0.95.
  TANDEM_BENCH_SAMPLING_BATCH=256 timeout 100 ncu --clock-control none \
    --kernel-id ::regex:'Sampling(Stream|Cluster)Kernel':'41|76|111' --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SourceCounters $bin/kb_bench - sampling >"$OUT/smp_ncu.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Sampling(Stream|Cluster)Kernel|Duration|DRAM Throughput|Achieved Occ|Waves Per" \
    "$OUT/smp_ncu.txt" | sed 's/(SamplingArgs.*//' | head -40
  cuobjdump --dump-sass $bin/kb_bench 2>/dev/null |
    awk '/Function :/ {p = ($3 ~ /Sampling(Cluster|Stream)/)} p' >"$OUT/smp_sass.txt"
  awk '{print $2}' "$OUT/smp_sass.txt" | grep -E "^[A-Z]" | sed 's/\..*//' | sort | uniq -c |
    sort -rn | head -25 | tr '\n' ' '
  echo
fi
if [[ $what == bench || $what == all ]]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/smp_bench.log"
  $bin/kb_bench "$OUT/smp_bench.jsonl" sampling >>"$OUT/smp_bench.log" 2>&1 ||
    tail -5 "$OUT/smp_bench.log"
  python3 kernels/bench/peer_sampling.py "$OUT/smp_peer.jsonl" >/tmp/smp_peer.log 2>&1 ||
    tail -5 /tmp/smp_peer.log
  grep ceilings "$OUT/smp_bench.log"
  python3 kernels/bench/report_kb.py "$OUT/smp_bench.jsonl" "$OUT/smp_peer.jsonl" |
    tee "$OUT/smp_table.txt"
fi
