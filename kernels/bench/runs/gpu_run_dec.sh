#!/bin/bash
# One GPU-machine run for helper "dec" (small-batch decode attention, issue #5): every
# attention GPU test, compute-sanitizer memcheck + racecheck on the small decode shapes, the
# decode benchmark rows (attention_bench decode_rope) of this tree and of the previous commit
# (.gpu-dec/base/attention_bench, built from the commit before the change) in the same call,
# interleaved, two rounds each, the SDPA peer (attention_peer.py), and the phase trace of single
# launches (.gpu-dec/trace/attention_bench: a -DTANDEM_DECODE_TRACE build, see
# paged_attention.cu); logs under $OUT and a short table last.
# Carried: .gpu-dec/ = attention_gpu_test, attention_bench, base/attention_bench,
# trace/attention_bench, _libs (tools/gpu/bundle-libs.sh .gpu-dec/_libs <binaries>).
set -o pipefail
B=.gpu-dec
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
N=/tmp/dec-logs  # per-tool logs, concatenated under $OUT (only ~8 files come back)
mkdir -p "$OUT" $N
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >"$OUT/smi.txt"
timeout 120 $B/attention_gpu_test >"$OUT/tests.log" 2>&1
echo "attention_gpu_test (all) exit=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure|error:" "$OUT/tests.log" | head -10
SMALL='PagedAttentionGpuTest.SmallBothPaths:PagedAttentionGpuTest.DecodeAwkwardLengths:PagedAttentionGpuTest.DecodeCombineInBatches'
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_gpu_test \
    --gtest_filter=$SMALL >"$N/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests? ran' "$N/sanitizer_$tool.log" | tr '\n' ' ')"
  cat "$N/sanitizer_$tool.log" >>"$OUT/sanitizer.log"
done
for round in 1 2; do
  timeout 90 $B/attention_bench decode_rope 2>&1 | sed "s/^RESULT/NEW$round/" >>"$OUT/bench.log"
  timeout 90 $B/base/attention_bench decode_rope 2>&1 | sed "s/^RESULT/BASE$round/" >>"$OUT/bench.log"
done
(cd kernels/bench && timeout 90 python3 - <<'PY'
import attention_peer as ap
for b, l in [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 4096), (64, 4096), (256, 1024)]:
    ap.decode(b, l)
PY
) 2>&1 | tee -a "$OUT/bench.log" | grep -c PEER
timeout 60 $B/trace/attention_bench small >"$OUT/trace.log" 2>&1
echo "== trace (us after the first CTA entry; e0 entry, e1 item read, e2 first tile in smem, e3 last tile done, e4 partial stored, e5 arrived, e6 combined) =="
cut -c1-600 "$OUT/trace.log" | grep TRACE
echo "== decode (32q/8kv/128): stream us, TB/s, graph us; NEW<round> = this tree, BASE<round> = previous commit =="
grep -E "^(NEW|BASE)[12] kernel=ceiling" "$OUT/bench.log"
grep -E "^(NEW|BASE)[12] kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ ips=default//; s/ items=.*//' | sort -s -t' ' -k2,4
grep -E "^PEER kernel=decode" "$OUT/bench.log"
