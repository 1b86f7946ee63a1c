#!/usr/bin/env bash
# The next session's GPU-machine calls (sessions 25-26 got almost no device time: session 25's
# gpu_run_s25.sh calls did not run once the machine was withdrawn, session 26 got none), most
# important first in each, so that a call cut short still brings back what it finished:
#   balance  the balanced decode plans (kernels/paged_attention/WORKLOG.md step 18): decode
#            attention on bf16 and fused fp8 caches, ragged lengths with the plans' own choice
#            and strided (TANDEM_DECODE_BALANCE=auto / off), uniform lengths balanced and strided
#            (force / off); then the attention GPU tests, compute-sanitizer memcheck + racecheck
#            on the small cases (balanced ones included), ncu at 128 x 4k ragged both ways.
#   peers    [decode-tc]'s table (kernels/bench/runs/gpu_run_fipeer.sh: tandem, FlashInfer's
#            tensor-core and CUDA-core decode, SDPA), then ncu of FlashInfer's tensor-core
#            kernel and tandem's at 128 x 4k, memory sections included. Carry .gpu-fipeer
#            (kernels/bench/runs/stage_flashinfer_peer.sh).
#   engine   the tests changed after session 24's last run (quantized TP / PP, TP, PP on CUDA,
#            the cuBLASLt tuning and GEMM tests), engine_cuda_test, then `tandem bench`
#            throughput (Llama-3-8B shapes, FP8 weights + FP8 KV; its uniform lengths keep the
#            strided plans) with the fused FP8 kernel's cp.async and TMA stages, our FP8
#            split-k, the extra cuBLASLt candidates, and ragged (--random-range-ratio 0.9) with
#            TANDEM_DECODE_BALANCE auto and off. The TP graph tests (CudaPeerBarrierTest, graphs
#            for TP 2 on one GPU) are in engine_cuda_tp_test; the FP8 split-k and extra
#            candidates' reference checks in fp8_gemm_lt_gpu_test. Before: kb_bench's FP8 GEMM
#            benches (fp8split, lttune_extra, lttune_dump).
#   tma      the stream kernel's TMA stages (kernels/paged_attention/WORKLOG.md step 19,
#            TANDEM_DECODE_COPIES=tma): check-sass, the attention GPU tests (every decode case
#            runs the TMA stages too), compute-sanitizer memcheck + racecheck on the small cases,
#            cp.async / TMA for fused fp8 ([quant] shapes) and bf16 ([decode-tc]), ncu of both.
#   order    [decode-tc]: the strided plans' item order, sequence- against head-major
#            (TANDEM_DECODE_ORDER, WORKLOG.md step 20), bf16 and fused fp8, ncu of both.
#   kernels  tma (~520 s: the attention GPU tests alone take up to ~6 minutes)
#   peers2   order, balance without the tests (kernels ran them), then peers (~200 s)
#   tests    named test binaries of the pack: TESTS="bin[:gtest filter] ..."
# Staged here (carry: [".gpu-pack27"]; for balance / peers / kernels, which need only
# attention_bench and attention_gpu_test, PACK=.gpu-pack27k with ".gpu-fipeer", since a call
# carries at most 64 MiB):
#   PACK=.gpu-pack27 BINS="kb_bench tandem" TEST_BINS="attention_gpu_test
#     engine_cuda_quant_tp_test fp8_gemm_lt_gpu_test engine_cuda_tp_test engine_cuda_pp_test
#     kernels_kb_gpu_test engine_cuda_test" engine/bench/runs/stage_pack.sh
#   PACK=.gpu-pack27k BINS="attention_bench" TEST_BINS="attention_gpu_test" \
#     engine/bench/runs/stage_pack.sh
# Usage there (kernels and peers2 with PACK=.gpu-pack27k; engine with the default pack):
#   [PACK=.gpu-pack27k] engine/bench/runs/gpu_run_s27.sh one|tma|order|balance|peers|kernels|peers2|engine|tests
set -uo pipefail
cd "$(dirname "$0")/../../.."
# A warm machine keeps the last call's .gpu-eng: unpack again when it came from another pack.
PACK=${PACK:-.gpu-pack27}
if [ "$(cat .gpu-eng/.pack 2>/dev/null)" != "$PACK" ]; then
  rm -rf .gpu-eng && tar -xJf "$PACK/eng.tar.xz" && echo "$PACK" >.gpu-eng/.pack
fi
S=.gpu-eng
source tools/gpu/gpu-env.sh --libs $S/_libs  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/s27-out}
LOGS=$OUT/logs
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$LOGS" "$MODELS"
source engine/bench/runs/run_lib.sh  # note, run_test, bench_tp, ncu_decode, run_named_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >"$LOGS/smi.txt"

# B L page kv: one `attention_bench one` shape under each TANDEM_DECODE_BALANCE of $MODES
# (default "auto off"), graph times (RAGGED=1: lengths drawn from [1, 2 L - 1],
# TANDEM_BENCH_RAGGED).
attention_ab() {
  local r=${RAGGED:-}
  for bal in ${MODES:-auto off}; do
    local f=$LOGS/one_${1}_${2}_${3}_${4}${r:+_ragged}_$bal.log
    env TANDEM_DECODE_BALANCE=$bal ${r:+TANDEM_BENCH_RAGGED=1} timeout 60 \
      $S/bin/attention_bench one "$1" "$2" "$3" "$4" >"$f" 2>&1
    note "attention one $1 $2 $3 $4${r:+ ragged} balance=$bal: $(grep -m1 -oE ' us=[0-9.]+ TBps=[0-9.]+.*graph_us=[0-9.]+ graph_TBps=[0-9.]+' \
      "$f" | cut -d' ' -f2-3,5-7) $(grep -m1 -oE 'merges=[0-9]+' "$f")"
  done
}

# B L page kv: one `attention_bench one` shape under each value of $VALS for variable $VAR,
# graph times (same call, one process per value).
env_ab() {
  for v in $VALS; do
    local f=$LOGS/one_${1}_${2}_${3}_${4}_${VAR}_$v.log
    env "$VAR=$v" timeout 60 $S/bin/attention_bench one "$1" "$2" "$3" "$4" >"$f" 2>&1
    note "attention one $1 $2 $3 $4 $VAR=$v: $(grep -m1 -oE 'graph_us=[0-9.]+ graph_TBps=[0-9.]+' "$f")"
  done
}

# [decode-tc]: the strided plans' item order (WORKLOG.md step 20), sequence-major (the heads of
# a page read together) against head-major (one head of many sequences, FlashInfer's grid
# order), bf16 and fused fp8; ncu's DRAM throughput of both at 128 x 4k.
order() {
  for shape in "128 4096 64 bf16" "128 4096 16 bf16" "256 2048 16 bf16" "32 4096 64 bf16" \
    "64 16384 64 bf16" "256 640 16 bf16" "128 4096 16 fused" "256 640 16 fused"; do
    VAR=TANDEM_DECODE_ORDER VALS="seq head" env_ab $shape
  done
  for o in seq head; do
    NCU_ENV="TANDEM_DECODE_ORDER=$o" ncu_decode bf16_order_$o 128 4096 64 bf16 \
      "DRAM Throughput|Duration|L2 Hit Rate|Mem Busy|No Eligible" SpeedOfLight \
      MemoryWorkloadAnalysis WarpStateStats
  done
}

# check-sass on the attention binaries, the attention GPU tests, compute-sanitizer memcheck and
# racecheck on the small cases (bf16 and fp8, the stream kernel's cp.async and TMA stages).
attention_tests() {
  tools/gpu/check-sass.sh $S/tests/attention_gpu_test $S/bin/attention_bench \
    >"$LOGS/check_sass.log" 2>&1
  note "check-sass exit=$?: $(tr '\n' ' ' <"$LOGS/check_sass.log" | cut -c1-300)"
  run_test attention_gpu_test 360
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $S/tests/attention_gpu_test \
      --gtest_filter='PagedAttentionGpuTest.SmallBothPaths:PagedAttentionFp8GpuTest.SmallForSanitizer' \
      >"$LOGS/san_$tool.log" 2>&1
    note "compute-sanitizer $tool exit=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$LOGS/san_$tool.log" | tr '\n' ' ')"
  done
}

# The stream kernel's stages filled by cp.async and by TMA (TANDEM_DECODE_COPIES, WORKLOG.md
# step 19), same call: `attention_bench one` for the fused fp8 kernel at the [quant] shapes
# (page 16, the engine's default; one at 64; one ragged) and bf16 at [decode-tc]'s, ncu of both
# at 128 x 4k and 256 x 640 (fp8) and 128 x 4k (bf16).
tma() {
  [ -n "${TESTED:-}" ] || attention_tests
  for shape in "256 640 16 fused" "256 1024 16 fused" "256 2048 16 fused" "128 4096 16 fused" \
    "256 4096 16 fused" "32 4096 16 fused" "64 640 16 fused" "32 8192 16 fused" \
    "128 4096 64 fused" "128 4096 64 bf16" "128 4096 16 bf16" "256 2048 64 bf16" \
    "32 4096 64 bf16" "256 640 64 bf16" "64 16384 64 bf16"; do
    VAR=TANDEM_DECODE_COPIES VALS="cp.async tma" env_ab $shape
  done
  for copies in cp.async tma; do
    env TANDEM_DECODE_COPIES=$copies TANDEM_BENCH_RAGGED=1 timeout 60 \
      $S/bin/attention_bench one 128 4096 16 fused >"$LOGS/one_ragged_fused_$copies.log" 2>&1
    note "attention one 128 4096 16 fused ragged copies=$copies: $(grep -m1 -oE \
      'graph_us=[0-9.]+ graph_TBps=[0-9.]+' "$LOGS/one_ragged_fused_$copies.log")"
  done
  local pattern="DRAM Throughput|Duration|No Eligible|Issue Slots Busy|Registers Per|Executed Ipc A"
  pattern="$pattern|Achieved Occupancy|Block Limit Shared|Bank Conflicts|Dynamic Shared"
  for copies in cp.async tma; do
    for shape in "128 4096 16 fused" "256 640 16 fused" "128 4096 64 bf16"; do
      NCU_ENV="TANDEM_DECODE_COPIES=$copies" ncu_decode "${copies}_${shape// /_}" $shape \
        "$pattern" SpeedOfLight WarpStateStats SchedulerStats LaunchStats Occupancy \
        MemoryWorkloadAnalysis_Tables InstructionStats
    done
  done
}

balance() {
  for shape in "256 1024 64" "256 2048 64" "128 4096 64" "64 4096 64" "256 640 64"; do
    RAGGED=1 attention_ab $shape bf16
  done
  for shape in "256 640 16" "256 1024 16" "128 4096 16" "256 2048 16"; do
    RAGGED=1 attention_ab $shape fused
  done
  for shape in "128 4096 64" "128 4096 16" "32 4096 64" "256 2048 16"; do
    MODES="force off" attention_ab $shape bf16
  done
  for shape in "256 640 16" "32 4096 16"; do MODES="force off" attention_ab $shape fused; done
  [ -n "${TESTED:-}" ] || attention_tests
  for bal in auto off; do
    NCU_ENV="TANDEM_DECODE_BALANCE=$bal TANDEM_BENCH_RAGGED=1" ncu_decode bf16_ragged_$bal 128 4096 64 bf16 \
      "DRAM Throughput|Duration|Memory Throughput|No Eligible|Issue Slots Busy|Registers" \
      SpeedOfLight WarpStateStats SchedulerStats LaunchStats
  done
  tar -C "$OUT" -czf "$OUT/logs_balance.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
}
peers() {
  OUT=$OUT/fipeer timeout 300 kernels/bench/runs/gpu_run_fipeer.sh all >"$LOGS/fipeer_run.txt" 2>&1
  note "gpu_run_fipeer exit=$?"
  cat "$OUT/fipeer/table.txt" >>"$OUT/summary.txt" 2>/dev/null
  # Where the 5-8% between the two at B >= 32 goes: both kernels under ncu at 128 x 4k (64),
  # the memory sections beside the warp states (WORKLOG.md step 18's open question).
  pattern="DRAM Throughput|Duration|Memory Throughput|L2 Hit Rate|Mem Busy|Max Bandwidth"
  pattern="$pattern|No Eligible|Issue Slots Busy|Registers|Achieved Occupancy|Block Size|Grid Size"
  sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
    --section SchedulerStats --section Occupancy --section LaunchStats)
  timeout 120 ncu --clock-control none -k regex:BatchPrefill --launch-skip 10 --launch-count 1 \
    "${sections[@]}" .gpu-fipeer/flashinfer_peer one 128 4096 64 4 >"$LOGS/ncu_fi_tc.txt" 2>&1
  note "ncu FlashInfer TC 128 x 4096 (64) exit=$?"
  grep -E "$pattern" "$LOGS/ncu_fi_tc.txt" | head -16 >>"$OUT/summary.txt"
  timeout 120 ncu --clock-control none -k regex:DecodeKernel --launch-skip 20 --launch-count 1 \
    "${sections[@]}" $S/bin/attention_bench one 128 4096 64 bf16 >"$LOGS/ncu_tandem.txt" 2>&1
  note "ncu tandem 128 x 4096 (64) exit=$?"
  grep -E "$pattern" "$LOGS/ncu_tandem.txt" | head -16 >>"$OUT/summary.txt"
  tar -C "$OUT" -czf "$OUT/logs_fipeer.tgz" fipeer logs && rm -rf "$OUT/fipeer" "$LOGS"
}

# Session 27's first call when device time is short (one call, ~530 s, the pack with
# attention_bench: PACK=.gpu-pack27 BINS="kb_bench tandem attention_bench"): the engine tests,
# the served FP8 benches, the TMA and order A/Bs, then the attention GPU tests that gate
# adopting TMA; engine_cuda_test last.
one() {
  TESTS="engine_cuda_tp_test engine_cuda_quant_tp_test fp8_gemm_lt_gpu_test engine_cuda_pp_test
    kernels_kb_gpu_test:GemmCudaTest.*" run_named_tests 120
  make_llama
  BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv
  BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_tma TANDEM_DECODE_COPIES=tma
  BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_split2 TANDEM_FP8_SPLITK=2
  BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_lt_extra TANDEM_LT_AUTOTUNE=1
  for shape in "256 640 16 fused" "128 4096 16 fused" "256 2048 16 fused" "32 8192 16 fused" \
    "128 4096 64 fused" "128 4096 64 bf16" "128 4096 16 bf16" "32 4096 64 bf16" \
    "64 16384 64 bf16" "256 640 64 bf16"; do
    VAR=TANDEM_DECODE_COPIES VALS="cp.async tma" env_ab $shape
  done
  for shape in "128 4096 64 bf16" "128 4096 16 bf16" "32 4096 64 bf16" "128 4096 16 fused"; do
    VAR=TANDEM_DECODE_ORDER VALS="seq head" env_ab $shape
  done
  tar -C "$OUT" -czf "$OUT/logs_one_a.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
  run_test attention_gpu_test 200
  TESTS="engine_cuda_test" run_named_tests 120
  tar -C "$OUT" -czf "$OUT/logs_one_b.tgz" logs && rm -rf "$LOGS"
}

case "${1:-}" in
  one) one ;;
  balance) balance ;;
  peers) peers ;;
  tma)
    tma
    tar -C "$OUT" -czf "$OUT/logs_tma.tgz" logs && rm -rf "$LOGS"
    ;;
  order) order ;;
  kernels)
    tma
    tar -C "$OUT" -czf "$OUT/logs_kernels.tgz" logs && rm -rf "$LOGS"
    ;;
  peers2)
    order
    TESTED=1 balance
    peers
    ;;
  engine)
    TESTS=${TESTS:-"engine_cuda_quant_tp_test fp8_gemm_lt_gpu_test engine_cuda_tp_test
      engine_cuda_pp_test kernels_kb_gpu_test:GemmCudaTest.* engine_cuda_test"}
    run_named_tests 150
    # The FP8 GEMMs beyond cuBLASLt's heuristic (kernels/quant_gemm/WORKLOG.md step 6): our
    # split-k against unsplit (graph replays), the extra candidates at the decode shapes, and
    # every config the check accepts for O at m = 256.
    for spec in "fp8split" "lttune_extra" "lttune_dump o 256 channel"; do
      # shellcheck disable=SC2086
      timeout 90 $S/bin/kb_bench - $spec >"$LOGS/kb_${spec// /_}.log" 2>&1
      note "kb_bench $spec exit=$?"
      grep -E "^(fp8split|lttune)" "$LOGS/kb_${spec// /_}.log" | head -30 >>"$OUT/summary.txt"
    done
    tar -C "$OUT" -czf "$OUT/logs_tests.tgz" logs && rm -rf "$LOGS" && mkdir -p "$LOGS"
    make_llama
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv
    # The fused FP8 kernel's TMA stages served (step 19), the FP8 split-k (quant_gemm step 6)
    # and the extra cuBLASLt candidates tuned at start-up, each against the default, same call.
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_tma TANDEM_DECODE_COPIES=tma
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_split2 TANDEM_FP8_SPLITK=2
    BENCH_KV_ARGS="--kv-cache-dtype fp8" bench_tp fp8kv_lt_extra TANDEM_LT_AUTOTUNE=1
    # Ragged contexts (2k in +-90%, 512 out +-90%), the plans' own choice against strided.
    for bal in auto off; do
      BENCH_KV_ARGS="--kv-cache-dtype fp8 --num-prompts 256 --input-len 2048 --output-len 512
        --random-range-ratio 0.9" bench_tp fp8kv_ragged_$bal TANDEM_DECODE_BALANCE=$bal
    done
    tar -C "$OUT" -czf "$OUT/logs_bench.tgz" logs && rm -rf "$LOGS"
    ;;
  tests)
    run_named_tests 240
    tar -C "$OUT" -czf "$OUT/logs_tests.tgz" logs && rm -rf "$LOGS"
    ;;
  *)
    echo "usage: $0 one|tma|order|balance|peers|kernels|peers2|engine|tests" >&2
    exit 2
    ;;
esac
cat "$OUT/summary.txt"
