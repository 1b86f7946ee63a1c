#!/usr/bin/env bash
# Builds libtandem_kernel_trace.so (kernel_trace.cc) against a CUPTI: the CUDA toolkit's
# extras/CUPTI, or the CUPTI of the same CUDA major version that PyTorch's wheels install
# (nvidia/cu13 with include/ and lib/). The library and its libcupti are copied to OUTDIR.
#   tools/gpu/kernel_trace/build.sh CUPTI_ROOT OUTDIR
set -euo pipefail
root=${1:?CUPTI root (with include/cupti.h and lib*/libcupti.so*)}
out=${2:?output directory}
cuda=${CUDA_HOME:-/usr/local/cuda}
lib=$(dirname "$(ls "$root"/lib*/libcupti.so* | head -1)")
mkdir -p "$out"
g++ -std=c++17 -O2 -shared -fPIC -fvisibility=hidden -I"$root/include" -I"$cuda/include" \
  "$(dirname "$0")/kernel_trace.cc" -L"$lib" -l:"$(basename "$(ls "$lib"/libcupti.so* | head -1)")" \
  -Wl,-rpath,'$ORIGIN' -o "$out/libtandem_kernel_trace.so"
cp -L "$lib"/libcupti.so* "$out/"
ls -la "$out"
