#!/usr/bin/env bash
# Runs on the GPU machine (see /work/shared/gpu/README.md) for the sampling kernels: the sampling
# GPU tests (every kernel against SamplingRef; the streaming top-k test first, alone, so a hang
# stops the run early), compute-sanitizer memcheck and racecheck on the small all-paths batch,
# kb_bench's sampling rows (default dispatch, the previous dispatch, the one-block-per-row kernel
# and the resident kernel in the same run), optionally ncu, and the PyTorch peer; full logs under
# $OUT, the table printed last.
# Built here first:  cmake --build build-smp --target kernels_kb_gpu_test kb_bench, then
#   rm -rf .gpu-smp && mkdir -p .gpu-smp && cp build-smp/tests/kernels_kb_gpu_test
#   build-smp/bin/kb_bench .gpu-smp/ && /work/shared/gpu/bundle-libs.sh .gpu-smp/_libs .gpu-smp/*
# Usage there: kernels/bench/gpu_run_smp2.sh [steps, default "test sanitize bench peer"]
#   steps: test sanitize bench peer ncu
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.gpu-smp/_libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smp-out}
mkdir -p "$OUT"
steps=${1:-test sanitize bench peer}
bin=.gpu-smp
has() { [[ " $steps " == *" $1 "* ]]; }
if has test; then
  timeout 40 $bin/kernels_kb_gpu_test --gtest_filter='SamplingCudaTest.StreamTopKSamplesItsRows' \
    >"$OUT/smp_test.log" 2>&1
  rc=$?
  echo "[${SECONDS}s] stream top-k test rc=$rc"
  if [[ $rc == 124 ]]; then echo "timed out (a hang?): stopping"; tail -5 "$OUT/smp_test.log"; exit 1; fi
  timeout 120 $bin/kernels_kb_gpu_test --gtest_filter='SamplingCudaTest.*' >>"$OUT/smp_test.log" 2>&1
  rc=$?
  echo "[${SECONDS}s] tests rc=$rc"
  grep -E "^\[  (PASSED|FAILED) |^\[       OK|FAILED|Failure|mismatch|differ" "$OUT/smp_test.log" | head -40
  [[ $rc == 124 ]] && { echo "tests timed out (a hang?): stopping"; exit 1; }
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $bin/kernels_kb_gpu_test \
      --gtest_filter='SamplingCudaTest.SmallBatchAllPaths:SamplingCudaTest.GreedyTies*' \
      >"$OUT/smp_sanitizer_$tool.log" 2>&1
    echo "[${SECONDS}s] $tool rc=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/smp_sanitizer_$tool.log" | head -2 | tr '\n' ' ')"
  done
fi
if has ncu; then
  # Default dispatch at B = 256, kernel invocations 76 (topk50_topp0.9; 5 warm-up + 30 timed per
  # mode, both kernels launched per call).
  TANDEM_BENCH_SAMPLING_BATCH=256 timeout 100 ncu --clock-control none \
    --kernel-id ::regex:'Sampling(Stream|Cluster)Kernel':'76' --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SourceCounters $bin/kb_bench - sampling >"$OUT/smp_ncu.txt" 2>&1
  echo "[${SECONDS}s] ncu rc=$?"
  grep -E "Sampling(Stream|Cluster)Kernel|Duration|DRAM Throughput|Achieved Occ|Registers Per" \
    "$OUT/smp_ncu.txt" | sed 's/(SamplingArgs.*//' | head -20
fi
if has bench; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/smp_bench.log"
  timeout 150 $bin/kb_bench "$OUT/smp_bench.jsonl" sampling >>"$OUT/smp_bench.log" 2>&1 ||
    tail -5 "$OUT/smp_bench.log"
  echo "[${SECONDS}s] bench done"
fi
touch "$OUT/smp_peer.jsonl"
if has peer; then
  timeout 120 python3 kernels/bench/peer_sampling.py "$OUT/smp_peer.jsonl" >"$OUT/smp_peer.log" 2>&1 ||
    tail -5 "$OUT/smp_peer.log"
  echo "[${SECONDS}s] peer done"
fi
if has bench; then
  grep ceilings "$OUT/smp_bench.log"
  python3 kernels/bench/report_kb.py "$OUT/smp_bench.jsonl" "$OUT/smp_peer.jsonl" |
    tee "$OUT/smp_table.txt" | grep -E "B=256|B=32 " 
fi
