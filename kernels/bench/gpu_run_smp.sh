#!/usr/bin/env bash
# Runs on the GPU machine (see /work/shared/gpu/README.md) for the sampling kernels: the sampling
# GPU tests (every kernel against SamplingRef), compute-sanitizer memcheck on a small batch, ncu on
# the cluster kernel at B = 256, kb_bench's sampling rows (default dispatch and the one-block-per-
# row kernel) and the PyTorch peer; full logs under $OUT, the table printed last.
# Built here first:  cmake --build build-smp --target kernels_kb_gpu_test kb_bench, then
#   mkdir -p .gpu-smp && cp build-smp/tests/kernels_kb_gpu_test build-smp/bin/kb_bench .gpu-smp/ &&
#   /work/shared/gpu/bundle-libs.sh .gpu-smp/_libs .gpu-smp/kernels_kb_gpu_test .gpu-smp/kb_bench
# Usage there: kernels/bench/gpu_run_smp.sh [all|test|sanitize|profile|bench] [gtest filter]
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.gpu-smp/_libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smp-out}
mkdir -p "$OUT"
what=${1:-all}
filter=${2:-SamplingCudaTest.*}
bin=.gpu-smp
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/smp_gpu.txt"
if [[ $what == test || $what == all ]]; then
  timeout 240 $bin/kernels_kb_gpu_test --gtest_filter="$filter" >"$OUT/smp_test.log" 2>&1
  echo "tests rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[       OK|FAILED|Failure|mismatch" "$OUT/smp_test.log" | head -40
fi
if [[ $what == sanitize || $what == all ]]; then
  timeout 120 compute-sanitizer --tool memcheck $bin/kernels_kb_gpu_test \
    --gtest_filter='SamplingCudaTest.SmallBatchAllPaths:SamplingCudaTest.GreedyTies*' \
    >"$OUT/smp_sanitizer.log" 2>&1
  echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/smp_sanitizer.log" | head -1)"
fi
if [[ $what == profile || $what == all ]]; then
  # Cluster kernel at B = 256, launches 41 / 76 / 111 of the B = 256 sampling section (5 warm-up +
  # 30 timed per mode): temp0.7, topk50_topp0.9, topp0.95.
  TANDEM_BENCH_SAMPLING_BATCH=256 timeout 150 ncu --clock-control none \
    --kernel-id ::regex:SamplingCluster:'41|76|111' --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats $bin/kb_bench - sampling >"$OUT/smp_ncu.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "SamplingCluster|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occ|Cluster|Waves" \
    "$OUT/smp_ncu.txt" | head -40
fi
if [[ $what == bench || $what == all ]]; then
  $bin/kb_bench "$OUT/smp_bench.jsonl" sampling >"$OUT/smp_bench.log" 2>&1 ||
    tail -5 "$OUT/smp_bench.log"
  python3 kernels/bench/peer_sampling.py "$OUT/smp_peer.jsonl" >"$OUT/smp_peer.log" 2>&1 ||
    tail -5 "$OUT/smp_peer.log"
  head -1 "$OUT/smp_bench.log"
  python3 kernels/bench/report_kb.py "$OUT/smp_bench.jsonl" "$OUT/smp_peer.jsonl" |
    tee "$OUT/smp_table.txt"
fi
