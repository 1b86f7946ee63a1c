#!/usr/bin/env bash
# Stages engine/bench/runs/gpu_run_s22.sh's binaries: engine/bench/stage_engine.sh's layout
# (.gpu-eng/{bin,tests,_libs}) with only what that call runs, packed as .gpu-pack22/eng.tar.xz
# so that it fits the 64 MiB a call carries beside the working tree.
# Usage: engine/bench/runs/stage_s22.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../../.."
dir=${1:-build}
stage=.gpu-eng
bins=(tandem tandem-router tandem-decode-worker tandem-prefill-worker tandem-loadgen attention_bench)
tests=(kv_page_copy_gpu_test cuda_kv_ipc_test attention_gpu_test engine_cuda_test
       disagg_equality_gpu_test)
cmake --build "$dir" --target "${bins[@]}" "${tests[@]}" -j"$(nproc)"
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/tests"
for b in "${bins[@]}"; do cp "$dir/bin/$b" "$stage/bin/"; done
for t in "${tests[@]}"; do cp "$dir/tests/$t" "$stage/tests/"; done
strip "$stage"/bin/* "$stage"/tests/*
tools/gpu/bundle-libs.sh "$stage/_libs" "$stage"/bin/* "$stage"/tests/* >/dev/null
mkdir -p .gpu-pack22
tar -cf - "$stage" | xz -T2 -6 >.gpu-pack22/eng.tar.xz
du -sh "$stage" .gpu-pack22/eng.tar.xz
