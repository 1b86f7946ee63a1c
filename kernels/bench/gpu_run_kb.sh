#!/usr/bin/env bash
# Runs on the GPU machine (see /work/shared/gpu/README.md): the GEMM/elementwise/sampling GPU
# tests, kb_bench and its PyTorch peer; full logs under $OUT, the merged table printed last.
# Built here first:  cmake --build build-kb --target kernels_kb_gpu_test kb_bench, then
#   mkdir -p .gpu-kb && cp build-kb/tests/kernels_kb_gpu_test build-kb/bin/kb_bench .gpu-kb/ &&
#   /work/shared/gpu/bundle-libs.sh .gpu-kb/_libs .gpu-kb/kernels_kb_gpu_test .gpu-kb/kb_bench
# Usage there: kernels/bench/gpu_run_kb.sh [test|bench|all] [gtest filter]
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.gpu-kb/_libs:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kb-out}
mkdir -p "$OUT"
what=${1:-all}
filter=${2:-*}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/kb_gpu.txt"
if [[ $what == test || $what == all ]]; then
  .gpu-kb/kernels_kb_gpu_test --gtest_filter="$filter" 2>&1 | tee "$OUT/kb_test.log" |
    grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error" | head -40
fi
if [[ $what == bench || $what == all ]]; then
  .gpu-kb/kb_bench "$OUT/kb_bench.jsonl" >"$OUT/kb_bench.log" 2>&1 || tail -5 "$OUT/kb_bench.log"
  python3 kernels/bench/peer_kb.py "$OUT/kb_peer.jsonl" >"$OUT/kb_peer.log" 2>&1 ||
    tail -5 "$OUT/kb_peer.log"
  head -1 "$OUT/kb_bench.log"
  python3 kernels/bench/report_kb.py "$OUT/kb_bench.jsonl" "$OUT/kb_peer.jsonl" |
    tee "$OUT/kb_table.txt"
fi
