#!/usr/bin/env bash
# Runs on the GPU machine (see tools/gpu/README.md): the GEMM/elementwise/sampling GPU
# tests, kb_bench and its PyTorch peer; full logs under $OUT, the merged table printed last.
# Built here first:  cmake --build build-kb --target kernels_kb_gpu_test kb_bench, then
#   mkdir -p .gpu-kb && cp build-kb/tests/kernels_kb_gpu_test build-kb/bin/kb_bench .gpu-kb/ &&
#   tools/gpu/bundle-libs.sh .gpu-kb/_libs .gpu-kb/kernels_kb_gpu_test .gpu-kb/kb_bench
# Usage there: kernels/bench/runs/gpu_run_kb.sh [test|bench|all] [gtest filter]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source tools/gpu/gpu-env.sh --libs "$PWD/.gpu-kb/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kb-out}
mkdir -p "$OUT"
what=${1:-all}
filter=${2:-*}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/kb_gpu.txt"
if [[ $what == test || $what == all ]]; then
  .gpu-kb/kernels_kb_gpu_test --gtest_filter="$filter" 2>&1 | tee "$OUT/kb_test.log" |
    grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error" | head -40
fi
if [[ $what == profile || $what == all ]]; then
  # ncu (clocks left alone) on the skinny GEMM and the sampling kernel, and a SASS summary.
  {
    ncu --clock-control none -k regex:Skinny -c 3 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy .gpu-kb/kb_bench - gemm 2>&1 |
      grep -vE "^(gemm|ceiling|==PROF==)" | tail -120
    # Sampling at B=256 (launches 315 and 350 of the sampling section: temp0.7, topk50_topp0.9).
    for skip in 315 350; do
      ncu --clock-control none -k regex:Sampling --launch-skip $skip -c 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis .gpu-kb/kb_bench - sampling 2>&1 |
        grep -vE "^(sampling|ceiling|==PROF==)" | grep -E "SamplingKernel|Throughput|Duration|Hit"
    done
    cuobjdump --dump-sass .gpu-kb/kernels_kb_gpu_test 2>/dev/null |
      awk '/Function :/ {f=$3} /LDG|FFMA|ATOM|RED|MUFU|F2I|LDL|STL/ {c[f" "$2]++}
           END {for (k in c) print c[k], k}' |
      grep -E "SkinnyGemmKernelILi1ELi(2ELi4|8ELi1)E13|SamplingKernel" | sort -k2 | head -60
  } >"$OUT/kb_profile.txt" 2>&1
fi
if [[ $what == bench || $what == all ]]; then
  .gpu-kb/kb_bench "$OUT/kb_bench.jsonl" >"$OUT/kb_bench.log" 2>&1 || tail -5 "$OUT/kb_bench.log"
  python3 kernels/bench/peer_kb.py "$OUT/kb_peer.jsonl" >"$OUT/kb_peer.log" 2>&1 ||
    tail -5 "$OUT/kb_peer.log"
  head -1 "$OUT/kb_bench.log"
  python3 kernels/bench/report_kb.py "$OUT/kb_bench.jsonl" "$OUT/kb_peer.jsonl" |
    tee "$OUT/kb_table.txt"
fi
