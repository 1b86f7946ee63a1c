#!/usr/bin/env bash
# Session 28's GPU-machine call, most important first, so that a call cut short still brings
# back what it finished:
#   quanttc  [quant]'s mixed-input tensor-core GEMM (kernels/quant_gemm/WORKLOG.md step 7):
#            its GPU test against QuantGemmRef, the skinny kernel's test, the engine's quantized
#            tests (QuantizedBatchesRunTheTensorCoreGemm with TANDEM_QUANT_TC=require), the
#            cuBLASLt accumulate test whose tolerance changed (kernels/gemm/gemm.h); `kb_bench -
#            quant` (QuantGemmTc beside dequantize + GEMM and the skinny kernel at the 8B
#            shapes); then `tandem bench` latency + decode (batch 8-64, context 1024) on
#            Llama-3-8B shapes quantized at load to INT8 and INT4, TANDEM_QUANT_TC=0 against the
#            default, same call; bf16 throughput with the stream kernel's cp.async and TMA
#            stages (paged_attention WORKLOG step 19's open question); the fp8 attention tests
#            session 28's first call did not reach.
# Staged here (carry: [".gpu-pack28"]):
#   PACK=.gpu-pack28 BINS="kb_bench tandem" TEST_BINS="quant_gemm_tc_gpu_test quant_gemm_gpu_test
#     kernels_kb_gpu_test engine_cuda_test attention_gpu_test" engine/bench/runs/stage_pack.sh
# Usage there: engine/bench/runs/gpu_run_s28.sh quanttc
set -uo pipefail
cd "$(dirname "$0")/../../.."
PACK=${PACK:-.gpu-pack28}
if [ "$(cat .gpu-eng/.pack 2>/dev/null)" != "$PACK" ]; then
  rm -rf .gpu-eng && tar -xJf "$PACK/eng.tar.xz" && echo "$PACK" >.gpu-eng/.pack
fi
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s28-out}
LOGS=$OUT/logs
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$LOGS" "$MODELS"
source engine/bench/runs/run_lib.sh  # note, run_test, make_llama, run_named_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,memory.total \
  --format=csv >"$LOGS/smi.txt"

# TAG QUANT [ENV=V...]: `tandem bench` latency + decode on $m quantized at load to QUANT.
bench_quant() {
  local tag=$1 quant=$2
  shift 2
  env "$@" timeout 150 $S/bin/tandem bench --model "$m" --quantization "$quant" \
    --scenarios latency,decode --latency-tokens 128 --batch-sizes 8,16,32,64 --contexts 1024 \
    --decode-tokens 32 --json "$LOGS/bench_$tag.json" >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^(latency|decode)' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

# TAG [ENV=V...]: `tandem bench` throughput on $m in bf16 (weights and KV).
bench_bf16() {
  local tag=$1
  shift
  env "$@" timeout 120 $S/bin/tandem bench --model "$m" --scenarios throughput \
    --json "$LOGS/bench_$tag.json" >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^throughput' "$LOGS/bench_$tag.log" | tr '\n' ' ')"
}

quanttc() {
  TESTS="quant_gemm_tc_gpu_test quant_gemm_gpu_test
    kernels_kb_gpu_test:GemmCudaTest.TunedCublasLtPlansOnDecodeShapes:GemmCudaTest.FusedNormAndAccumulate
    engine_cuda_test:*Quant*" run_named_tests 120
  timeout 120 $S/bin/kb_bench - quant >"$LOGS/kb_quant.log" 2>&1
  note "kb_bench quant exit=$?"
  grep -E "quant|ceiling|read" "$LOGS/kb_quant.log" | head -90 >>"$OUT/summary.txt"
  tar -C "$OUT" -czf "$OUT/logs_quanttc_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  make_llama
  for q in int8 int4; do
    bench_quant ${q}_tc $q
    bench_quant ${q}_dequant $q TANDEM_QUANT_TC=0
  done
  bench_bf16 bf16_cpasync TANDEM_DECODE_COPIES=cp.async
  bench_bf16 bf16_tma TANDEM_DECODE_COPIES=tma
  tar -C "$OUT" -czf "$OUT/logs_quanttc_b.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  run_test attention_gpu_test 150 --gtest_filter='PagedAttentionFp8GpuTest.*:-*.DecodeAwkwardShapes:*.SmallForSanitizer'
  tar -C "$OUT" -czf "$OUT/logs_quanttc_c.tgz" logs && rm -rf "$LOGS"
}

case "${1:-}" in
  quanttc) quanttc ;;
  *)
    echo "usage: $0 quanttc" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
