#!/bin/bash
# One GPU-machine run for the prefill attention kernels (the Hopper wgmma/TMA kernel and the
# mma.sync fallback): correctness first (both prefill test binaries), compute-sanitizer memcheck
# and racecheck on small shapes, the benchmark of both kernels with the ceilings measured in the
# same run, the PyTorch peer (flash, cuDNN), ncu of one 16k launch, a SASS summary; full logs
# under $OUT, a short table last.
# Carried: .gpu-pf/ (attention_prefill_gpu_test, attention_gpu_test, attention_bench and
# _libs from tools/gpu/bundle-libs.sh). Optional first argument "quick": no sanitizers.
set -o pipefail
B=.gpu-pf
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv | tee "$OUT/smi.txt"
# Variants of the Hopper kernel (benchmark switches), each tested before it is timed.
VARIANTS="default TANDEM_PREFILL_PINGPONG=1"
for v in $VARIANTS; do
  env ${v/default/} timeout 150 $B/attention_prefill_gpu_test >> "$OUT/tests.log" 2>&1
  echo "attention_prefill_gpu_test ($v) exit=$?"
done
timeout 200 $B/attention_gpu_test >> "$OUT/tests.log" 2>&1
echo "attention_gpu_test exit=$?"
grep -E "^\[  (FAILED|PASSED)|Failure|error:|Expected|Which is" "$OUT/tests.log" | head -30
if [ "$1" != quick ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_prefill_gpu_test \
      --gtest_filter=PrefillGpuTest.SmallForSanitizer > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | head -2 | tr '\n' ' ')"
  done
fi
(cuobjdump --dump-resource-usage $B/attention_bench 2>&1 | grep -A1 -E "Prefill" | grep -E "Function|REG";
 cuobjdump --dump-sass $B/attention_bench > /tmp/sass.txt 2>&1;
 echo "SASS: HGMMA $(grep -c HGMMA /tmp/sass.txt) UTMALDG $(grep -c UTMALDG /tmp/sass.txt) HMMA $(grep -c HMMA /tmp/sass.txt) LDL/STL $(grep -cE 'LDL|STL' /tmp/sass.txt)") > "$OUT/sass_summary.txt" 2>&1
for v in $VARIANTS $VARIANTS; do  # twice, interleaved: the spread between repeats is the noise
  env ${v/default/} timeout 150 $B/attention_bench prefill 2>&1 | sed "s/^RESULT kernel=prefill/RESULT kernel=prefill variant=$v/" | tee -a "$OUT/bench.log" | grep RESULT
done
timeout 100 python3 kernels/bench/attention_peer.py prefill 2>&1 | tee -a "$OUT/bench.log"
timeout 120 ncu --clock-control none -k regex:PrefillSm90 -c 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section ComputeWorkloadAnalysis $B/attention_bench prefill_ncu > "$OUT/ncu_prefill.txt" 2>&1
echo "ncu exit=$?: $(grep -E 'Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Executed Ipc Active' "$OUT/ncu_prefill.txt" | tr -s ' ' | tr '\n' ';')"
tail -1 "$OUT/sass_summary.txt"
echo "== prefill (32 q heads, 8 KV heads, D=128, causal) =="
grep -E "^RESULT kernel=ceiling" "$OUT/bench.log"
grep -E "^RESULT kernel=prefill" "$OUT/bench.log" | sed 's/^RESULT kernel=prefill //'
grep -E "^PEER" "$OUT/bench.log" | sed 's/^PEER kernel=prefill //'
