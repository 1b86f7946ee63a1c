#!/usr/bin/env bash
# Runs on the GPU machine (see tools/gpu/README.md) for the sampling kernels, in one call
# under a wall-clock budget (each step's timeout is cut to what is left of it): the streaming top-k
# test (first and alone, so a hang stops the run early), kb_bench's sampling section (run A), the
# other sampling GPU tests (every kernel against SamplingRef), compute-sanitizer memcheck on the
# small all-paths batch, kb_bench again (run B: the run-to-run spread), ncu of the default top-k
# launch at B = 256, the PyTorch peer if time is left; full logs under $OUT, the table last (run
# A and run B per row, us). Used for session 4 of kernels/sampling/WORKLOG.md (the bound modes
# were then rows of kb_bench, timed interleaved with the default in each run).
# Built here first:  cmake --build build-smp --target kernels_kb_gpu_test kb_bench, then
#   rm -rf .gpu-smp && mkdir -p .gpu-smp && cp build-smp/tests/kernels_kb_gpu_test
#   build-smp/bin/kb_bench .gpu-smp/ && tools/gpu/bundle-libs.sh .gpu-smp/_libs .gpu-smp/*
# Usage there: kernels/bench/runs/gpu_run_smp2.sh [budget in seconds, default 145]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source tools/gpu/gpu-env.sh --libs "$PWD/.gpu-smp/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smp-out}
mkdir -p "$OUT"
budget=${1:-145}
bin=.gpu-smp
# Seconds for a step: at most $1, and no more than what is left of the budget ($2: the least worth
# starting with, else 0 = skip).
left() {
  local t=$((budget - SECONDS - 3))
  ((t > $1)) && t=$1
  ((t < $2)) && t=0
  echo $t
}
bench() {  # $1: run name
  local t
  t=$(left 45 15)
  ((t == 0)) && { echo "[${SECONDS}s] bench $1 skipped (time)"; return; }
  timeout "$t" $bin/kb_bench "$OUT/smp_bench_$1.jsonl" sampling >"$OUT/smp_bench_$1.log" 2>&1 ||
    { echo "bench $1 rc=$?"; tail -3 "$OUT/smp_bench_$1.log"; }
  echo "[${SECONDS}s] bench $1 done"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
t=$(left 40 10)
timeout "$t" $bin/kernels_kb_gpu_test --gtest_filter='SamplingCudaTest.StreamTopKSamplesItsRows' \
  >"$OUT/smp_test.log" 2>&1
rc=$?
echo "[${SECONDS}s] stream top-k test rc=$rc"
if [[ $rc == 124 ]]; then echo "timed out (a hang?): stopping"; tail -5 "$OUT/smp_test.log"; exit 1; fi
bench A
t=$(left 60 10)
timeout "$t" $bin/kernels_kb_gpu_test \
  --gtest_filter='SamplingCudaTest.*:-SamplingCudaTest.StreamTopKSamplesItsRows' \
  >>"$OUT/smp_test.log" 2>&1
echo "[${SECONDS}s] other sampling tests rc=$?"
grep -E "^\[  (PASSED|FAILED) |^\[       OK|FAILED|Failure|mismatch|differ" "$OUT/smp_test.log" |
  head -30
t=$(left 40 15)
if ((t > 0)); then
  timeout "$t" compute-sanitizer --tool memcheck --error-exitcode 9 $bin/kernels_kb_gpu_test \
    --gtest_filter='SamplingCudaTest.SmallBatchAllPaths' >"$OUT/smp_sanitizer.log" 2>&1
  echo "[${SECONDS}s] memcheck rc=$?: $(grep -h 'ERROR SUMMARY' "$OUT/smp_sanitizer.log" | head -1)"
  grep -E "^\[  (PASSED|FAILED) " "$OUT/smp_sanitizer.log"
fi
bench B
# The default dispatch's streaming kernel on the top-k 50 + top-p 0.9 rows at B = 256: the 6th of
# its launches in that mode (35 per mode: 5 warm-up + 30 timed; greedy, temperature, top-k).
t=$(left 50 25)
if ((t > 0)); then
  TANDEM_BENCH_SAMPLING_BATCH=256 timeout "$t" ncu --clock-control none \
    -k regex:SamplingStreamKernel --launch-skip 75 --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section SourceCounters $bin/kb_bench - sampling >"$OUT/smp_ncu.txt" 2>&1
  echo "[${SECONDS}s] ncu rc=$?"
  grep -E "SamplingStreamKernel|Duration|DRAM Throughput|Achieved Occ|Registers Per|Stall" \
    "$OUT/smp_ncu.txt" | sed 's/(SamplingArgs.*//' | head -12
fi
touch "$OUT/smp_peer.jsonl"
t=$(left 60 40)
if ((t > 0)); then
  timeout "$t" python3 kernels/bench/peer_sampling.py "$OUT/smp_peer.jsonl" >"$OUT/smp_peer.log" 2>&1 ||
    tail -3 "$OUT/smp_peer.log"
  echo "[${SECONDS}s] peer done"
fi
# Table: every sampling row, run A and run B (us), the peer where measured.
grep -h ceilings "$OUT"/smp_bench_*.log
python3 - "$OUT" <<'EOF' | tee "$OUT/smp_table.txt"
import json, os, sys
out = sys.argv[1]
runs = {}
for name in ("A", "B"):
    p = os.path.join(out, f"smp_bench_{name}.jsonl")
    if os.path.exists(p):
        for l in open(p):
            r = json.loads(l)
            if r["kernel"].startswith("sampling"):
                runs.setdefault((r["shape"], r["kernel"]), {})[name] = r["us"]
peer = {}
for l in open(os.path.join(out, "smp_peer.jsonl")):
    r = json.loads(l)
    peer[(r["shape"], r["kernel"])] = r["us"]
for (shape, kernel), v in runs.items():
    p = peer.get((shape, kernel)) or peer.get((shape, "sampling." + kernel.split(".", 1)[1]))
    cells = " ".join(f"{v[n]:8.2f}" if n in v else "       -" for n in ("A", "B"))
    print(f"{shape:15s} {kernel:34s} {cells} {'' if p is None else round(p, 1)}")
EOF
