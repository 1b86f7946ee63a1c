#!/usr/bin/env bash
# Builds the engine's GPU binaries here (nvcc, sm_90a; no GPU needed), strips them and stages them
# with their shared libraries in .gpu-eng/, packed as .gpu-pack/eng.tar.xz (~25 MB, under the
# 64 MiB a call carries) for engine/bench/gpu_run_engine.sh on the GPU machine
# (carry: [".gpu-pack"]). Usage: [TANDEM_CUPTI_ROOT=DIR] engine/bench/stage_engine.sh [build dir,
# default build]; with TANDEM_CUPTI_ROOT the CUPTI kernel tracer travels too.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build}
stage=.gpu-eng
bins=(tandem tandem-router tandem-decode-worker tandem-prefill-worker tandem-loadgen attention_bench kb_bench)
tests=(engine_cuda_test kernels_kb_gpu_test logits_gpu_test attention_gpu_test
       attention_prefill_gpu_test quant_gemm_gpu_test fp8_gemm_lt_gpu_test cuda_kv_ipc_test
       kv_page_copy_gpu_test disagg_equality_gpu_test fault_transfer_gpu_test
       rmsnorm_quant_gpu_test engine_cuda_ops_fused_act_quant_test)
[ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja -DTANDEM_CUDA=ON
cmake --build "$dir" --target "${bins[@]}" "${tests[@]}" -j"$(nproc)"
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/tests"
for b in "${bins[@]}"; do cp "$dir/bin/$b" "$stage/bin/"; done
for t in "${tests[@]}"; do cp "$dir/tests/$t" "$stage/tests/"; done
strip "$stage"/bin/* "$stage"/tests/*
# The CUPTI kernel tracer, when a CUPTI is at hand (tools/gpu/kernel_trace/README.md).
if [ -n "${TANDEM_CUPTI_ROOT:-}" ]; then
  tools/gpu/kernel_trace/build.sh "$TANDEM_CUPTI_ROOT" "$stage/trace" >/dev/null
fi
tools/gpu/bundle-libs.sh "$stage/_libs" "$stage"/bin/* "$stage"/tests/* >/dev/null
mkdir -p .gpu-pack
tar -cf - "$stage" | xz -T2 -6 >.gpu-pack/eng.tar.xz
du -sh "$stage" .gpu-pack/eng.tar.xz
