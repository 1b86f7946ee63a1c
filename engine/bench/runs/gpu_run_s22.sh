#!/usr/bin/env bash
# Session 22's one GPU-machine call (about 7 minutes of device time in all), most important
# first, so that a call cut short still brings back what it finished:
#   1. the IPC transfer (comm/README.md "warm connections", kernels/kv_page_copy/WORKLOG.md
#      step 3): kv_page_copy_gpu_test (the one-launch multi-layer copy against the reference) and
#      cuda_kv_ipc_test (cold and warm transfers, Begin / enqueue / Finish);
#   2. the fused FP8 decode kernel (kernels/paged_attention/WORKLOG.md step 13): both fp8
#      decode kernels against the CPU reference, then `attention_bench decode_fp8`;
#   3. the prefill-heavy rate sweep with fresh prompts per point (loadgen `--sweep-prompts
#      fresh`), mixed vs 1P1D over IPC, Qwen3-8B shapes (engine/bench/gpu_run_engine.sh sweep);
#   4. the engine's and the 1P1D layout's FP8 KV tests with the fused kernel selected.
# Staged here (reduced engine pack; carry: [".gpu-pack23"]):
#   EXTRA_TESTS="kv_page_copy_gpu_test cuda_kv_ipc_test" PACK=.gpu-pack23 engine/bench/runs/stage_pack.sh
# Usage there: engine/bench/runs/gpu_run_s22.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -d .gpu-eng ] || tar -xJf .gpu-pack23/eng.tar.xz
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s22-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
source engine/bench/runs/run_lib.sh  # note, run_test
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$LOGS/smi.txt"

# 1. IPC.
run_test kv_page_copy_gpu_test 60
grep -hE "^BENCH" "$LOGS/kv_page_copy_gpu_test.log" >>"$OUT/summary.txt"
run_test cuda_kv_ipc_test 120
grep -hE "^BENCH" "$LOGS/cuda_kv_ipc_test.log" >>"$OUT/summary.txt"

# 2. FP8 decode.
run_test attention_gpu_test 120 --gtest_filter='PagedAttentionFp8GpuTest.*'
timeout 120 $S/bin/attention_bench decode_fp8 >"$LOGS/attention_bench_fp8.log" 2>&1
note "attention_bench decode_fp8 exit=$?"
grep -E "^RESULT" "$LOGS/attention_bench_fp8.log" | sed "s/^RESULT kernel=//" >>"$OUT/summary.txt"

# Packed now, so that a call cut short later still brings them back as one file.
tar -C "$OUT" -czf "$OUT/logs_12.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"

# 3. The prefill-heavy sweep, 64 fresh prompts a point; both layouts within SWEEP_DEADLINE_S.
# gpu_run_engine.sh packs and removes its own $OUT/logs: it gets a folder of its own.
SWEEP_WORKLOADS=${SWEEP_WORKLOADS:-prefill:2048:128:64:8,12,16,20} \
  SWEEP_DEADLINE_S=${SWEEP_BUDGET_S:-150} OUT=$OUT/sweep \
  engine/bench/gpu_run_engine.sh sweep >"$LOGS/sweep_run.txt" 2>&1
note "sweep exit=$?"
cat "$OUT/sweep/summary.txt" >>"$OUT/summary.txt"

# 4. FP8 KV end to end with the fused decode kernel.
export TANDEM_FP8_DECODE=fused  # 'fused-experimental' in run 27, before step 14
TAG=_fused run_test engine_cuda_test 120 --gtest_filter='*Fp8Kv*'
TAG=_fused run_test disagg_equality_gpu_test 150 --gtest_filter='*Fp8Kv*'
grep -hE "^disagg equality" "$LOGS"/disagg_equality_gpu_test_fused.log >>"$OUT/summary.txt"
unset TANDEM_FP8_DECODE
tar -C "$OUT" -czf "$OUT/logs_34.tgz" logs && rm -rf "$LOGS"
