#!/bin/bash
# One GPU-machine run for the bandwidth-bound kernels of helper "bw": small-batch decode
# attention, the skinny GEMM at M = 1 and RoPE/KV-store. Correctness first (decode, RoPE and
# GEMM GPU tests), compute-sanitizer memcheck + racecheck on small decode shapes, then the
# benchmarks with the copy/read ceilings measured in the same run, the old kernels (a build of
# the previous commit) in the same call, plan/hint variants, the PyTorch peers (SDPA on
# contiguous KV, torch.matmul), ncu of one launch of the changed kernels; logs under $OUT and a
# short table last.
# Carried: .gpu-bw/ = attention_gpu_test, attention_bench, kernels_kb_gpu_test, kb_bench,
# base/attention_bench, _libs. Staged here: cmake --build build-bw --target attention_gpu_test
# attention_bench kernels_kb_gpu_test kb_bench; base/attention_bench = attention_bench built
# from the commit before the kernel changes under test (runs 1-3: f62b290) with this commit's
# attention_bench.cc (for the decode_rope mode); then tools/gpu/bundle-libs.sh
# .gpu-bw/_libs <the five binaries>.
# First argument: "quick" (no sanitizers, no ncu), "full" (more profiles: decode stall
# reasons, the old decode kernel, the bulk-copy GEMM), default: tests, sanitizers, benchmarks,
# peers and ncu of the default paths.
set -o pipefail
B=.gpu-bw
source tools/gpu/gpu-env.sh --libs "$PWD/$B/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
# The prefill tests in the decode filter use the mma.sync prefill kernel (the Hopper one is
# checked by gpu_run_prefill.sh), so this run depends only on the kernels it is about.
export TANDEM_PREFILL_KERNEL=fa2
OUT=${OUT:-/tmp/out}
N=/tmp/bw-ncu  # per-profile files, concatenated into $OUT/ncu_all.txt (8 files come back)
mkdir -p "$OUT" $N
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >"$OUT/smi.txt"
DEC='PagedAttentionGpuTest.*Decode*:PagedAttentionGpuTest.SmallBothPaths:PagedAttentionGpuTest.GraphReplays*'
DEC="$DEC:PagedAttentionGpuTest.OddAndWide*:PagedAttentionGpuTest.EmptyBatch*:RopeKvStoreGpuTest.*"
timeout 150 $B/attention_gpu_test --gtest_filter="$DEC" >"$OUT/tests.log" 2>&1
echo "attention_gpu_test (decode, rope) exit=$?"
timeout 100 $B/kernels_kb_gpu_test --gtest_filter='GemmCudaTest.*' >>"$OUT/tests.log" 2>&1
echo "kernels_kb_gpu_test (gemm) exit=$?"
grep -E "^\[  (FAILED|PASSED)|Failure|error:" "$OUT/tests.log" | head -20
if [ "$1" != quick ]; then
  SMALL='PagedAttentionGpuTest.SmallBothPaths:PagedAttentionGpuTest.DecodeAwkwardLengths:RopeKvStoreGpuTest.Qwen3QkNorm'
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $B/attention_gpu_test \
      --gtest_filter=$SMALL >"$N/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$N/sanitizer_$tool.log" | head -2 | tr '\n' ' ')"
    cat "$N/sanitizer_$tool.log" >>"$OUT/sanitizer.log"
  done
fi
# Benchmarks: new kernels, then the previous commit's, then plan/hint variants (new kernels).
timeout 90 $B/attention_bench decode_rope 2>&1 | tee "$OUT/bench.log" | grep -c RESULT
timeout 90 $B/base/attention_bench decode_rope 2>&1 | sed 's/^RESULT/BASE/' | tee -a "$OUT/bench.log" | grep -c BASE
timeout 90 $B/kb_bench - gemm >"$OUT/kb_bench.log" 2>&1 || tail -3 "$OUT/kb_bench.log"
(cd kernels/bench && timeout 90 python3 - <<'EOF'
import torch
import attention_peer as ap
for b, l in [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 4096), (64, 4096), (256, 1024)]:
    ap.decode(b, l)
L2 = 60 * 2**20
for k, n in [(4096, 24576), (12288, 4096)]:  # as peer_kb.py: events per call, median of 50
    ws = [torch.empty(n, k, device="cuda", dtype=torch.bfloat16).uniform_(-0.05, 0.05)
          for _ in range(max(1, -(-3 * L2 // (n * k * 2))))]
    a = torch.empty(1, k, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    for i in range(5):
        torch.matmul(a, ws[i % len(ws)].t())
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(50)]
    for i, (s, e) in enumerate(ev):
        s.record(); torch.matmul(a, ws[i % len(ws)].t()); e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in ev)
    print(f"PEER kernel=gemm M=1 K={k} N={n} us={t[25] * 1e3:.2f} TBps={n * k * 2 / t[25] * 1e-9:.3f}")
EOF
) 2>&1 | tee -a "$OUT/bench.log" | grep -c PEER
if [ "$1" != quick ]; then
  NCU="ncu --clock-control none --cache-control none --section SpeedOfLight --section LaunchStats"
  NCU="$NCU --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats"
  NCU="$NCU --kernel-name-base demangled"
  # One warm decode launch at B=32 L=4k page 16 (the first shape of "ncu": the no-split
  # kernel); "full": also B=1 L=8k page 16 (the first shape of "small"), new and old.
  timeout 60 $NCU -k regex:DecodeKernel --launch-skip 12 -c 1 $B/attention_bench ncu >"$N/ncu_decode_b32.txt" 2>&1
  # Skinny GEMM M = 1 bf16, 12288 -> 4096 (second shape; skip 60 = its 6th launch): the 8x1
  # kernel of the default dispatch (ncu matches demangled names: "<(int)1, (int)8, ...").
  timeout 60 $NCU -k "regex:SkinnyGemmKernel<.int.1, .int.8, .int.1, __nv" --launch-skip 60 -c 1 $B/kb_bench - gemm >"$N/ncu_gemm.txt" 2>&1
  # RoPE/KV-store with QK-norm at 16k tokens (launches 15-28 of decode_rope are the QK-norm ones).
  timeout 60 $NCU -k regex:RopeKvStore --launch-skip 19 -c 1 $B/attention_bench decode_rope >"$N/ncu_rope.txt" 2>&1
  if [ "$1" = full ]; then
    timeout 60 $NCU -k regex:DecodeKernel --launch-skip 12 -c 1 $B/attention_bench small >"$N/ncu_decode.txt" 2>&1
    timeout 60 $NCU -k regex:DecodeKernel --launch-skip 12 -c 1 $B/base/attention_bench small >"$N/ncu_decode_base.txt" 2>&1
    timeout 60 $NCU -k "regex:SkinnyBulkKernel<.int.1, __nv" --launch-skip 60 -c 1 $B/kb_bench - gemm >"$N/ncu_gemm_bulk.txt" 2>&1
    # Where the B=1 L=8k decode warps stall (percent of active warp cycles, by reason).
    STALL=barrier,long_scoreboard,short_scoreboard,wait,math_pipe_throttle,membar,mio_throttle,lg_throttle,no_instruction,dispatch_stall,not_selected,selected
    M=$(echo $STALL | tr ',' '\n' | sed 's/.*/smsp__warp_issue_stalled_&_per_warp_active.pct/' | paste -sd,)
    M=${M/smsp__warp_issue_stalled_selected_per_warp_active.pct/smsp__issue_active.avg.pct_of_peak_sustained_active}
    timeout 60 ncu --clock-control none --cache-control none --metrics "$M" -k regex:DecodeKernel --launch-skip 12 -c 1 \
      $B/attention_bench small >"$N/ncu_decode_stalls.txt" 2>&1
  fi
  for f in ncu_decode_b32 ncu_gemm ncu_rope ncu_decode ncu_decode_base ncu_gemm_bulk ncu_decode_stalls; do
    [ -f "$N/$f.txt" ] || continue
    echo "$f: $(grep -E '^ +(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|L2 Hit Rate|smsp__[a-z_.]+) ' "$N/$f.txt" | tr -s ' ' | sed 's/smsp__warp_issue_stalled_//; s/_per_warp_active.pct//' | tr '\n' ';')"
    (echo "==== $f"; cat "$N/$f.txt") >>"$OUT/ncu_all.txt"
  done
fi
echo "== ceilings =="
grep -E "^(RESULT|BASE) kernel=ceiling" "$OUT/bench.log"
grep -E "ceiling" "$OUT/kb_bench.log" | head -1
echo "== decode (32q/8kv/128): us, TB/s, graph us | BASE = previous kernels, same run =="
grep -E "^(RESULT|BASE).* kernel=decode" "$OUT/bench.log" | sed -E 's/kernel=decode //; s/ frac_copy=[^ ]+//; s/ graph_TBps=[^ ]+//; s/ ips=default//; s/ items=.*//'
grep -E "^PEER kernel=decode" "$OUT/bench.log"
echo "== rope_kv_store 16k tokens =="
grep -E "^(RESULT|BASE) kernel=rope" "$OUT/bench.log"
echo "== gemm M=1 =="
grep -E "M=1 K=(4096 N=24576|12288 N=4096)" "$OUT/kb_bench.log" | grep -E "^gemm" | head -20
grep -E "^PEER kernel=gemm" "$OUT/bench.log"
