#!/usr/bin/env bash
# Runs on the GPU machine for session 6 of kernels/sampling/WORKLOG.md (helper "smp4": top-p-only
# rows). Stage dirs under .gpu-smp4/: base (the tree before the change) and the builds named below.
# Steps (a list in $1, default "bench"): test ($TEST_BIN, default new: every sampling GPU test),
# memcheck (the same binary, SmallBatchAllPaths), bench (kb_bench sampling of the stage dirs in
# $ROUNDS, default "base new base new": interleaved rounds), ncu (the
# resident kernel's top-p 0.95 launch at B = 256 of $NCU_BIN, default base: full set with
# source-level stall sampling, per-line summary). Logs under $OUT; a table of the bench rows last.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source tools/gpu/gpu-env.sh --libs "$PWD/.gpu-smp4/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/smp4-out}
mkdir -p "$OUT"
steps=${1:-bench}
S=.gpu-smp4
log=$OUT/smp4_run.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee -a "$log"
has() { [[ ",$steps," == *",$1,"* ]]; }
if has test; then
  timeout 200 $S/${TEST_BIN:-new}/kernels_kb_gpu_test --gtest_filter='SamplingCudaTest.*' >"$OUT/smp4_test.log" 2>&1
  echo "[${SECONDS}s] sampling tests rc=$?" | tee -a "$log"
  grep -E "^\[  (PASSED|FAILED) |^\[       OK|FAILED|Failure|mismatch|differ" "$OUT/smp4_test.log" |
    head -40 | tee -a "$log"
fi
if has memcheck; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $S/${TEST_BIN:-new}/kernels_kb_gpu_test \
    --gtest_filter='SamplingCudaTest.SmallBatchAllPaths' >"$OUT/smp4_sanitizer.log" 2>&1
  echo "[${SECONDS}s] memcheck rc=$?: $(grep -h 'ERROR SUMMARY' "$OUT/smp4_sanitizer.log" | head -1)" |
    tee -a "$log"
fi
if has bench; then
  rounds=${ROUNDS:-"base new base new"}
  i=0
  for b in $rounds; do
    i=$((i + 1))
    timeout 90 $S/$b/kb_bench "$OUT/bench_${i}_$b.jsonl" sampling >"$OUT/bench_${i}_$b.txt" 2>&1
    echo "[${SECONDS}s] bench $i $b rc=$?" | tee -a "$log"
  done
  grep -h "ceilings\|stream build" "$OUT"/bench_1_base.txt | tee -a "$log"
  for f in "$OUT"/bench_*_*.txt; do echo "== $f"; cat "$f"; done >"$OUT/bench_log.txt"
  rm -f "$OUT"/bench_*_*.txt
fi
if has ncu; then
  nb=${NCU_BIN:-base}
  # Resident launches at B = 256: 35 per mode (5 warm-up + 30 timed), modes greedy, temp, top-k,
  # top-p: the 111th is a top-p 0.95 one.
  TANDEM_BENCH_SAMPLING_BATCH=256 timeout 150 ncu --clock-control none \
    -k regex:SamplingClusterKernel --launch-skip 110 --launch-count 1 --set full \
    --import-source yes -o "$OUT/prof" $S/$nb/kb_bench - sampling >"$OUT/ncu_run.txt" 2>&1
  echo "[${SECONDS}s] ncu rc=$?" | tee -a "$log"
  ncu -i "$OUT/prof.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source cuda >"$OUT/src_cuda.csv" 2>&1 ||
    ncu -i "$OUT/prof.ncu-rep" --page source --csv >"$OUT/src_cuda.csv" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass >"$OUT/src_sass.csv" 2>&1
  python3 - "$OUT" <<'PY' >"$OUT/ncu_lines.txt" 2>&1
import csv, sys, os, collections
out = sys.argv[1]
for name in ("src_cuda.csv", "src_sass.csv"):
    p = os.path.join(out, name)
    rows = list(csv.reader(open(p, errors="replace")))
    hdr_i = next((i for i, r in enumerate(rows) if any("Stall Sampling" in c for c in r)), None)
    print("==", name, "rows", len(rows), "header at", hdr_i)
    if hdr_i is None:
        print("\n".join(",".join(r)[:200] for r in rows[:15]))
        continue
    hdr = rows[hdr_i]
    print("columns:", hdr[:40])
    col = next(i for i, c in enumerate(hdr) if "Stall Sampling (All" in c)
    src = 0 if name == "src_cuda.csv" else next((i for i, c in enumerate(hdr) if c in ("Source", "# Address")), 0)
    data = []
    for r in rows[hdr_i + 1:]:
        try:
            data.append((float(r[col] or 0), r))
        except (ValueError, IndexError):
            pass
    tot = sum(d[0] for d in data) or 1
    print("total samples", tot)
    keep = [i for i, c in enumerate(hdr) if "Stall" in c or c in ("#", "Line", "Source", "Address")][:30]
    for v, r in sorted(data, key=lambda d: -d[0])[:45]:
        print(f"{100*v/tot:5.1f}% | " + " | ".join(r[i][:110] for i in range(min(3, len(r)))))
PY
  gzip -f "$OUT/src_sass.csv"
  rm -f "$OUT/src_cuda.csv" "$OUT/prof.ncu-rep" "$OUT/ncu_run.txt"
  grep -E "Duration|DRAM Throughput|Achieved Occ|Registers Per|Warp Cycles Per Issued|No Eligible|Barrier|Stall" \
    "$OUT/ncu_details.txt" | head -30 | tee -a "$log"
  head -60 "$OUT/ncu_lines.txt" | tee -a "$log"
fi
python3 - "$OUT" <<'PY' | tee -a "$log"
import json, glob, os, sys, collections
out = sys.argv[1]
rows = collections.OrderedDict()
files = sorted(glob.glob(os.path.join(out, "bench_*.jsonl")), key=lambda p: int(os.path.basename(p).split("_")[1]))
for p in files:
    tag = os.path.basename(p)[:-6].split("_", 1)[1]
    for l in open(p):
        r = json.loads(l)
        if r["kernel"].startswith("sampling"):
            rows.setdefault((r["shape"], r["kernel"]), {})[tag] = r["us"]
tags = [os.path.basename(p)[:-6].split("_", 1)[1] for p in files]
print(f"{'shape':15s} {'kernel':36s} " + " ".join(f"{t:>9s}" for t in tags))
for (s, k), v in rows.items():
    print(f"{s:15s} {k:36s} " + " ".join(f"{v[t]:9.2f}" if t in v else "        -" for t in tags))
PY
for f in "$OUT"/bench_*_*.jsonl; do
  [[ -e $f ]] || continue
  t=$(basename "$f" .jsonl)
  sed "s/^{/{\"run\": \"$t\", /" "$f"
done >"$OUT/bench_all.jsonl" && rm -f "$OUT"/bench_*_*.jsonl
