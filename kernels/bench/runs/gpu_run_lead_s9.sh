#!/bin/bash
# Lead runs of session 9 (kernels/sampling/WORKLOG.md): A/B of two kb_bench builds of the sampling
# kernels staged side by side (.gpu-lead/kb_bench = A, kb_bench_b = B), interleaved rounds of
# kb_bench's sampling section, then ncu with per-instruction stall sampling of B's row-pipelined
# kernel at B = 256 (NCU_BIN, default b; kernels/bench/ncu_sass_summary.py condenses the SASS
# page). Knobs: TEST_BIN (the test binary to run; "none" skips), SAN=0, ROUNDS (default "a b a b";
# a name v runs kb_bench_v), NCU_MODES (default "topp0.95 topk50_topp0.9"; "none" skips), ROWS
# (regex of the bench rows in the table). Stage with kernels/bench/stage_gpu.sh and copy the other
# binaries in; carry [".gpu-lead"]. Every log ends up in $OUT/logs.tgz (a call brings back at most
# 8 files).
set -o pipefail
source kernels/bench/runs/lead_tests.sh  # S (the stage), the environment, OUT
lead_tests "${TEST_BIN:-kernels_kb_gpu_test_b}"
i=0
for v in ${ROUNDS:-a b a b}; do
  i=$((i + 1))
  bin=$S/kb_bench
  [ "$v" != a ] && bin=$S/kb_bench_$v
  timeout 200 $bin "$OUT/kb_${i}_$v.jsonl" sampling >"$OUT/kb_${i}_$v.log" 2>&1
  echo "[${SECONDS}s] bench round $i ($v) exit=$?"
done
grep -h "ceilings" "$OUT"/kb_1_*.log
echo "== us per round (rounds: ${ROUNDS:-a b a b})"
rows=${ROWS:-'^sampling(\.|_rowpipe_alone\.)(greedy|temp0.7|topk50_topp0.9|topp0.95) +B=(1|128|256) '}
for f in "$OUT"/kb_*_*.log; do grep -E "$rows" "$f" | awk -v f="$(basename "$f" .log)" '{print $1, $2, f, $4}'; done |
  awk '{k=$1" "$2; v[k]=v[k]" "$3":"$4} END {for (k in v) print k, v[k]}' | sort
echo "== rows left to the resident kernel (every input copy)"
grep -H "rows left" "$OUT"/kb_*_*.log | sed 's/.*kb_[0-9]*_//' | sort -u | grep -v " 0 of "
for mode in ${NCU_MODES:-topp0.95 topk50_topp0.9}; do
  [ "$mode" = none ] && break
  TANDEM_BENCH_SAMPLING_BATCH=256 TANDEM_BENCH_SAMPLING_MODE=$mode timeout 150 ncu \
    --clock-control none -k regex:RowPipe -s 3 -c 1 --set full --import-source yes \
    -o "$OUT/ncu_$mode" $S/kb_bench_${NCU_BIN:-b} - sampling >"$OUT/ncu_$mode.log" 2>&1
  ncu -i "$OUT/ncu_$mode.ncu-rep" --page details >"$OUT/ncu_${mode}_details.txt" 2>&1
  ncu -i "$OUT/ncu_$mode.ncu-rep" --page source --csv --print-source sass >"$OUT/sass.csv" 2>&1
  python3 kernels/bench/ncu_sass_summary.py "$OUT/sass.csv" >"$OUT/ncu_${mode}_sass.txt" 2>&1
  rm -f "$OUT/ncu_$mode.ncu-rep" "$OUT/sass.csv"
  echo "[${SECONDS}s] ncu $mode: $(grep -E 'Duration|DRAM Throughput|L2 Hit Rate|Registers Per|Executed Instructions  |Issued Ipc Active' "$OUT/ncu_${mode}_details.txt" | tr -s ' ' | tr '\n' ';')"
  sed -n 1,2p "$OUT/ncu_${mode}_sass.txt"
done
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '^logs.tgz$'))
