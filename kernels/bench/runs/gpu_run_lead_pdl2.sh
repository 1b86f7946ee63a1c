#!/bin/bash
# Lead run I (session 6): where the decode kernel releases its PDL dependents. B (this tree): at
# the start of each CTA's last item; A (.gpu-lead/a, the build of run H): at kernel start. All
# attention GPU tests with B, then `attention_bench decode` A, B, A, B.
set -o pipefail
B=.gpu-lead
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 150 $B/attention_gpu_test >"$OUT/tests.log" 2>&1
echo "attention_gpu_test exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" "$OUT/tests.log" | head -10
for round in 1 2; do
  timeout 120 $B/a/attention_bench decode 2>&1 | sed "s/^RESULT/A$round/" >>"$OUT/bench.log"
  timeout 120 $B/attention_bench decode 2>&1 | sed "s/^RESULT/B$round/" >>"$OUT/bench.log"
done
echo "== decode: stream us | graph PDL / plain us | RopeKvStore+attention pair PDL / plain us =="
grep -E "^[AB][12] kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ ips=default//; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ items=[^ ]+ merges=[^ ]+//' | sort -s -t' ' -k2,4
