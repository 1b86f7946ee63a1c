#!/usr/bin/env bash
# One GPU-machine call that checks every kernel: all GPU tests (attention decode/prefill/RoPE,
# GEMM, norms, SiLU, embedding, sampling, logits processing, logprobs) against the CPU
# references, compute-sanitizer memcheck and racecheck on small attention shapes, on the small
# all-paths sampling batch and on the small logits-processing and logprobs batches, both
# benchmarks with the ceilings measured in the same run, and the PyTorch peers; full logs under
# $OUT, the short tables last.
# Staged here by kernels/bench/stage_gpu.sh into .gpu-all/ (carry: [".gpu-all"]).
# Usage there: [STAGE=.gpu-xyz] kernels/bench/gpu_run_all.sh [test]
#   ("test": correctness only, no benchmarks; STAGE: the stage dir, default .gpu-all)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${STAGE:-.gpu-all}
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/all-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >"$OUT/smi.txt"
fail=0
# At most 8 files come back from a call: tests.log, sanitizer.log, attention_bench.log,
# kb_bench.{log,jsonl}, kb_peer.jsonl, smi.txt and summary.txt (the status lines, printed again
# after the tables so that they are in the tail of the output).
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
: >"$OUT/tests.log"
for t in attention_gpu_test attention_prefill_gpu_test kernels_kb_gpu_test logits_gpu_test quant_gemm_gpu_test; do
  echo "===== $t" >>"$OUT/tests.log"
  timeout 240 $B/$t >"$OUT/test.tmp" 2>&1
  rc=$?
  [ $rc -ne 0 ] && fail=1
  note "$t exit=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$OUT/test.tmp" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" "$OUT/test.tmp" | head -10 | tee -a "$OUT/summary.txt"
  cat "$OUT/test.tmp" >>"$OUT/tests.log"
done
rm -f "$OUT/test.tmp"
: >"$OUT/sanitizer.log"
for tool in memcheck racecheck; do
  echo "===== $tool" >>"$OUT/sanitizer.log"
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_gpu_test \
    --gtest_filter='PagedAttentionGpuTest.SmallBothPaths:RopeKvStoreGpuTest.Qwen3QkNorm' \
    >"$OUT/san.tmp" 2>&1
  rc1=$?
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_prefill_gpu_test \
    --gtest_filter=PrefillGpuTest.SmallForSanitizer >>"$OUT/san.tmp" 2>&1
  rc2=$?
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/kernels_kb_gpu_test \
    --gtest_filter=SamplingCudaTest.SmallBatchAllPaths >>"$OUT/san.tmp" 2>&1
  rc3=$?
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/logits_gpu_test \
    --gtest_filter='*.SmallForSanitizer' >>"$OUT/san.tmp" 2>&1
  rc4=$?
  [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ $rc3 -ne 0 ] || [ $rc4 -ne 0 ] && fail=1
  note "compute-sanitizer $tool exit=$rc1/$rc2/$rc3/$rc4: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san.tmp" | sort | uniq -c | tr '\n' ' ')"
  cat "$OUT/san.tmp" >>"$OUT/sanitizer.log"
done
rm -f "$OUT/san.tmp"
[ "${1:-}" = test ] && exit $fail
timeout 240 $B/attention_bench >"$OUT/attention_bench.log" 2>&1 || note "attention_bench failed"
timeout 150 python3 kernels/bench/attention_peer.py >>"$OUT/attention_bench.log" 2>&1
timeout 240 $B/kb_bench "$OUT/kb_bench.jsonl" >"$OUT/kb_bench.log" 2>&1 || note "kb_bench failed"
timeout 150 python3 kernels/bench/peer_kb.py "$OUT/kb_peer.jsonl" >/dev/null 2>&1
timeout 150 python3 kernels/bench/peer_sampling.py "$OUT/peer_sampling.tmp" >/dev/null 2>&1
cat "$OUT/peer_sampling.tmp" >>"$OUT/kb_peer.jsonl" 2>/dev/null
rm -f "$OUT/peer_sampling.tmp"
note "benchmarks done"
echo "== attention (32 q heads, 8 KV heads, D=128) =="
python3 kernels/bench/attention_table.py "$OUT/attention_bench.log"
echo "== GEMM, elementwise, sampling =="
python3 kernels/bench/report_kb.py "$OUT/kb_bench.jsonl" "$OUT/kb_peer.jsonl"
echo "== status =="
cat "$OUT/summary.txt"
exit $fail
