#!/bin/bash
# [decode-tc]'s comparison in one GPU call: tandem's decode kernel at the issue's shapes
# (attention_bench decode_tc: pages 16 and 64, GQA groups 4 and 8), FlashInfer's tensor-core and
# CUDA-core decode paths at the same shapes (flashinfer_peer, each checked against its fp32
# reference first), and the PyTorch SDPA peer, joined by attention_table.py.
# Staged here by kernels/bench/runs/stage_flashinfer_peer.sh into .gpu-fipeer (STAGE=.gpu-xyz for
# another); on the GPU machine (carry: [".gpu-fipeer"]), from the repository root:
#   kernels/bench/runs/gpu_run_fipeer.sh [all|check|san]
# check: flashinfer_peer check only; san: that check under compute-sanitizer memcheck too.
# Writes summary.log, fipeer_check.log, attention.log and table.txt (san: sanitizer.log) to $OUT.
# Step timeouts add up to under the 600 s a GPU call may take.
set -o pipefail
B=${STAGE:-.gpu-fipeer}
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S=$OUT/summary.log
echo "FlashInfer $(cat "$B/FLASHINFER_COMMIT")" >>"$S"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >>"$S"
timeout 100 "$B/flashinfer_peer" check >"$OUT/fipeer_check.log" 2>&1
echo "flashinfer_peer check exit=$? ok=$(grep -c 'check=ok' "$OUT/fipeer_check.log")" \
  "failed=$(grep -cE 'check=FAIL|error=' "$OUT/fipeer_check.log")" >>"$S"
if [ "${1:-all}" = san ]; then
  timeout 480 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/flashinfer_peer" check \
    >"$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck flashinfer_peer check exit=$?" \
    "$(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log")" >>"$S"
elif [ "${1:-all}" = all ]; then
  timeout 200 "$B/attention_bench" decode_tc >"$OUT/attention.log" 2>&1
  echo "attention_bench decode_tc exit=$? rows=$(grep -c 'kernel=decode' "$OUT/attention.log")" >>"$S"
  timeout 180 "$B/flashinfer_peer" >>"$OUT/attention.log" 2>&1
  echo "flashinfer_peer exit=$? rows=$(grep -c '^PEER kernel=decode impl' "$OUT/attention.log")" >>"$S"
  timeout 100 python3 kernels/bench/attention_peer.py decode_tc >>"$OUT/attention.log" 2>&1
  echo "attention_peer.py (SDPA) exit=$?" >>"$S"
  python3 kernels/bench/attention_table.py "$OUT/attention.log" >"$OUT/table.txt" 2>&1
fi
cat "$S"
grep -E 'check=FAIL|error=' "$OUT/fipeer_check.log" "$OUT/attention.log" 2>/dev/null | head -20
[ -f "$OUT/table.txt" ] && cat "$OUT/table.txt"
exit 0
