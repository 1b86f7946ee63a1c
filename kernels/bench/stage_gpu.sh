#!/usr/bin/env bash
# Builds every GPU test and benchmark binary here (nvcc, sm_90a; no GPU needed) and stages them
# with their shared libraries in .gpu-all/ for kernels/bench/gpu_run_all.sh on the GPU machine
# (carry: [".gpu-all"]; keep it under the 64 MiB a call can carry).
# Usage: kernels/bench/stage_gpu.sh [build dir, default build-gpu] [stage dir, default .gpu-all]
# (a second stage dir lets two people stage different trees; gpu_run_all.sh reads it from STAGE)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-gpu}
stage=${2:-.gpu-all}
case "$stage" in .gpu-*) ;; *) echo "stage dir must be .gpu-* (git-ignored)" >&2; exit 2 ;; esac
bins=(attention_gpu_test attention_prefill_gpu_test kernels_kb_gpu_test logits_gpu_test quant_gemm_gpu_test attention_bench
  kb_bench)
[ -f "$dir/build.ninja" ] ||
  cmake -S . -B "$dir" -G Ninja -DTANDEM_CUDA=ON -DTANDEM_WERROR=ON
cmake --build "$dir" --target "${bins[@]}" -j"$(nproc)"
rm -rf "$stage" && mkdir -p "$stage"
for b in "${bins[@]}"; do cp "$(find "$dir" -name "$b" -type f -perm -u+x | head -1)" "$stage/"; done
tools/gpu/bundle-libs.sh "$stage/_libs" "$stage"/* >/dev/null
du -sh "$stage"
