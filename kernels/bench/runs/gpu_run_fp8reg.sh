#!/usr/bin/env bash
# One GPU-machine call for the fused FP8 decode kernel (kernels/paged_attention/WORKLOG.md step
# 13): the fp8 attention GPU tests (both fp8 decode kernels against PagedAttentionRef), then
# `attention_bench decode_fp8` (bf16, fp8 dequant and fp8 fused rows at the same shapes, one
# process), a short table last; `san` adds compute-sanitizer memcheck and racecheck on the small
# fp8 case (both kernels).
# Stage here (~20 MB with the libraries; carry: [".gpu-fp8reg"]):
#   cmake --build build -j2 --target attention_gpu_test attention_bench
#   mkdir -p .gpu-fp8reg && cp build/tests/attention_gpu_test build/bin/attention_bench .gpu-fp8reg/
#   tools/gpu/bundle-libs.sh .gpu-fp8reg/_libs .gpu-fp8reg/attention_*
# (any stage dir holding both binaries works: STAGE=.gpu-all for stage_gpu.sh's).
# Usage there: [STAGE=.gpu-xyz] kernels/bench/runs/gpu_run_fp8reg.sh [san]
set -uo pipefail
cd "$(dirname "$0")/../../.."
S=${STAGE:-.gpu-fp8reg}
source tools/gpu/gpu-env.sh --libs "$PWD/$S/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/fp8reg-out}
mkdir -p "$OUT"
: >"$OUT/summary.txt"
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv >"$OUT/smi.txt"
timeout 240 $S/attention_gpu_test --gtest_filter='PagedAttentionFp8GpuTest.*' \
  >"$OUT/tests.log" 2>&1
note "attention_gpu_test fp8 exit=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' \
  "$OUT/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure$" -A4 "$OUT/tests.log" | head -30 >>"$OUT/summary.txt"
timeout 240 $S/attention_bench decode_fp8 >"$OUT/attention_bench.log" 2>&1 ||
  note "attention_bench decode_fp8 failed: $(tail -3 "$OUT/attention_bench.log")"
if [ "${1:-}" = san ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $S/attention_gpu_test \
      --gtest_filter='PagedAttentionFp8GpuTest.SmallForSanitizer' >"$OUT/$tool.log" 2>&1
    note "compute-sanitizer $tool exit=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$OUT/$tool.log" | tr '\n' ' ')"
  done
fi
echo "== decode, graph replays: us (TB/s; fp8 rows count fp8 page bytes) =="
python3 - "$OUT/attention_bench.log" <<'EOF'
import sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT kernel=decode "):
        continue
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    key = (int(kv["B"]), int(kv["L"]), int(kv["page"]))
    name = "bf16" if kv["kv"] == "bf16" else kv["fp8_kernel"]
    rows.setdefault(key, {})[name] = (float(kv["graph_us"]), float(kv["graph_TBps"]))
print("| B x L (page) | bf16 | fp8 dequant | fp8 fused | fused / dequant time | fused / bf16 time |")
print("| --- | --- | --- | --- | --- | --- |")
for (b, l, p), r in rows.items():
    cell = lambda n: "%.2f (%.2f)" % r[n] if n in r else "-"
    ratio = lambda n, d: "%.3f" % (r[n][0] / r[d][0]) if n in r and d in r else "-"
    print(f"| {b} x {l} ({p}) | {cell('bf16')} | {cell('dequant')} | {cell('fused')} | "
          f"{ratio('fused', 'dequant')} | {ratio('fused', 'bf16')} |")
EOF
grep -E "kernel=ceiling" "$OUT/attention_bench.log"
echo "== status =="
cat "$OUT/summary.txt"
