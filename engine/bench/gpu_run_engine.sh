#!/usr/bin/env bash
# One GPU-machine call for the engine on the CUDA backend: the GPU tests (kernels, then the engine
# against the CPU backend and transformers), `tandem bench` on 8B shapes (Llama-3-8B, then
# Qwen3-8B) with an op profile of decode steps, and the transformers + torch.compile peer on the
# same checkpoints; full logs in one archive under $OUT, the short tables last.
# Staged here by engine/bench/stage_engine.sh (carry: [".gpu-pack"]).
# Usage there: engine/bench/gpu_run_engine.sh [attn_tc|tests|faults|bench|quant|abnorm|abactq|profile|trace|ncu|served|served1p1d|peer|spec|hf|prefix|sweep|all]...
# (default: all, which leaves out faults, prefix, sweep and abactq; PRESETS="llama3-8b qwen3-8b" by
# default, "qwen3-8b" when only sweep and faults are asked for). `hf` runs the engine test against
# transformers on the preset itself (8B shapes); `tests` runs it on the small presets with
# TANDEM_REF_PYTHON set by the caller. TANDEM_STAGE=DIR runs the binaries of DIR/bin and
# DIR/tests instead of the packed .gpu-eng (a build folder: the script's logic on the CPU with
# CPU layouts and a tiny preset, engine/bench/README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
S=${TANDEM_STAGE:-.gpu-eng}
[ -d "$S" ] || tar -xJf .gpu-pack/eng.tar.xz
source tools/gpu/gpu-env.sh --libs $S/_libs --info
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
OUT=${OUT:-/tmp/eng-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
MODELS=${MODELS:-/tmp/tandem-models}
what=${*:-all}
prefix_tables=""
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
want() { [[ " $what " == *" $1 "* || " $what " == *" all "* ]]; }
named() { [[ " $what " == *" $1 "* ]]; }  # modes that `all` leaves out
only_named() {  # every mode asked for is one of the arguments
  local w
  for w in $what; do [[ " $* " == *" $w "* ]] || return 1; done
}
if only_named sweep faults; then PRESETS=${PRESETS:-qwen3-8b}; fi
PRESETS=${PRESETS:-llama3-8b qwen3-8b}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw --format=csv \
  >"$LOGS/smi.txt"

run_test() {  # name timeout [args...]
  local t=$1 limit=$2
  shift 2
  timeout "$limit" $S/tests/$t "$@" >"$LOGS/$t.log" 2>&1
  local rc=$?
  note "$t exit=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$LOGS/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure$" -A3 "$LOGS/$t.log" | head -24 >>"$OUT/summary.txt"
}

if want attn_tc; then
  # Decode shapes through the prefill kernels (GQA heads packed as mma rows) beside the decode
  # kernel, same inputs, outputs compared: the input for [decode-tc].
  timeout 240 $S/bin/attention_bench decode_as_prefill >"$LOGS/attn_tc.log" 2>&1
  note "attention decode_as_prefill exit=$?"
  grep -E "^RESULT" "$LOGS/attn_tc.log" | sed 's/^RESULT kernel=decode_as_prefill //' >>"$OUT/summary.txt"
fi

if want tests; then
  # TESTS picks a subset (default: all five).
  for t in ${TESTS:-kernels_kb_gpu_test logits_gpu_test attention_gpu_test quant_gemm_gpu_test engine_cuda_test}; do
    run_test "$t" 420
  done
  grep -hE "max \|cuda|greedy tokens|batch invariance|device sampling|graphs vs eager" \
    "$LOGS/engine_cuda_test.log" 2>/dev/null | head -120 >>"$OUT/summary.txt"
  grep -hE "^BENCH|^disagg equality" "$LOGS"/*.log 2>/dev/null >>"$OUT/summary.txt"
fi

if named faults; then
  # The fault matrix's transfer phase on the GPU (tests/deploy/fault_transfer_e2e_test.cc built
  # as fault_transfer_gpu_test): the CUDA backend, prefill and decode workers on GPU 0, KV over
  # CUDA IPC, the small-qwen3 preset; SIGSTOP / SIGKILL of decode-0, SIGKILL of prefill-0 and of
  # the router, and cancel, each while three requests' KV is in flight, held before its first
  # byte and again with every page written (--kv-transfer-hold-ms). One verdict per cell.
  run_test fault_transfer_gpu_test 280
  grep -E "^(cell|matrix): |^\[  FAILED  \] FaultTransfer" "$LOGS/fault_transfer_gpu_test.log" \
    >>"$OUT/summary.txt"
fi

# The engine step counters of the first worker's /metrics (tandem_worker_engine_*, output
# handling) as "name value" lines.
worker_step_metrics() {  # serve.log
  local url
  url=$(grep -oE 'http://[0-9.:]+/metrics +\((mixed|decode)' "$1" | head -1 | cut -d' ' -f1)
  curl -sf "$url" | grep -E '^tandem_worker_(engine_[a-z_]+_total|output_handling_seconds_total)' |
    sed -E 's/\{[^}]*\}//'
}

# Per-step averages between two worker_step_metrics snapshots.
step_breakdown() {  # before after
  python3 - "$1" "$2" <<'PY'
import sys
def read(p):
    return {l.split()[0]: float(l.split()[1]) for l in open(p) if l.strip()}
a, b = read(sys.argv[1]), read(sys.argv[2])
d = {k: b[k] - a.get(k, 0.0) for k in b}
n = d.get("tandem_worker_engine_steps_total", 0)
if n <= 0:
    print("  no engine steps between the snapshots"); sys.exit()
ms = lambda k: 1e3 * d.get(k, 0.0) / n
print(f"  worker: {n:.0f} steps ({d.get('tandem_worker_engine_graph_steps_total', 0):.0f} graph, "
      f"{d.get('tandem_worker_engine_async_steps_total', 0):.0f} async); per step: engine "
      f"{ms('tandem_worker_engine_step_seconds_total'):.3f} ms, of it device wait "
      f"{ms('tandem_worker_engine_device_wait_seconds_total'):.3f} ms; output handling "
      f"{ms('tandem_worker_output_handling_seconds_total'):.3f} ms")
PY
}

serve_and_load() {  # through the router: tandem serve LAYOUT and tandem-loadgen (B=1, C=256)
  local layout=${1:-h200-mixed} c256=${2:-256} async=${3:-1}
  local file=deploy/layouts/$layout.yaml
  if [ "$async" = 0 ]; then
    file=$OUT/${layout}_sync.yaml
    sed 's/^engine:$/engine:\n  async_scheduling: false/' deploy/layouts/$layout.yaml >"$file"
    layout=${layout}_sync
  fi
  $S/bin/tandem serve --layout "$file" --model "$m" --port 8000 \
    --log-dir "$LOGS/serve_${layout}_$preset" >"$LOGS/serve_${layout}_$preset.log" 2>&1 &
  local pid=$!
  for _ in $(seq 240); do
    curl -sf http://127.0.0.1:8000/ready >/dev/null 2>&1 && break
    sleep 0.5
  done
  local lg=($S/bin/tandem-loadgen --base-url http://127.0.0.1:8000 --tokenizer "$m" --ignore-eos
            --request-rate inf --save-result --result-dir "$LOGS" --disable-progress)
  local tag=${layout}_$preset
  local slog=$LOGS/serve_${layout}_$preset.log
  worker_step_metrics "$slog" >"$LOGS/steps0_$tag.txt"
  timeout 120 "${lg[@]}" --num-prompts 8 --max-concurrency 1 --random-input-len 128 \
    --random-output-len 256 --label "served_b1_$tag" >"$LOGS/served_b1_$tag.log" 2>&1
  note "served $layout B=1 $preset exit=$?"
  grep -E "Successful|throughput|TPOT|ITL|TTFT" "$LOGS/served_b1_$tag.log" | head -9 \
    >>"$OUT/summary.txt"
  worker_step_metrics "$slog" >"$LOGS/steps1_$tag.txt"
  step_breakdown "$LOGS/steps0_$tag.txt" "$LOGS/steps1_$tag.txt" >>"$OUT/summary.txt"
  timeout 180 "${lg[@]}" --num-prompts "$c256" --max-concurrency "$c256" \
    --random-input-len 128 --random-output-len 1024 --label "served_c${c256}_$tag" \
    >"$LOGS/served_c${c256}_$tag.log" 2>&1
  note "served $layout C=$c256 $preset exit=$?"
  grep -E "Successful|throughput|TPOT|TTFT" "$LOGS/served_c${c256}_$tag.log" | head -9 \
    >>"$OUT/summary.txt"
  worker_step_metrics "$slog" >"$LOGS/steps2_$tag.txt"
  step_breakdown "$LOGS/steps1_$tag.txt" "$LOGS/steps2_$tag.txt" >>"$OUT/summary.txt"
  kill -TERM $pid
  wait $pid
}

# The users' question on one GPU ([gpu-disagg]): tandem-loadgen rate sweeps against `tandem
# serve` with each of SWEEP_LAYOUTS (NAME=FILE; default the mixed worker, then 1 prefill + 1
# decode worker sharing GPU 0 with the KV over CUDA IPC), for each of SWEEP_WORKLOADS
# (NAME:INPUT:OUTPUT:PROMPTS:RATES, PROMPTS requests per point at each of the comma-separated
# Poisson RATES in req/s), goodput under the SLOs of SWEEP_GOODPUT (ms); then one report per
# workload comparing the layouts. Every piece has a timeout, cut so that everything ends by
# SWEEP_DEADLINE_S seconds after the script started (a loadgen cut short gets SIGINT and saves
# the points it measured). The defaults fit one call of < 9 minutes with Qwen3-8B on one H200:
# capacity ~16 req/s prefill-heavy (2k-token prefills at ~600 TFLOP/s are ~50 ms each, plus the
# decodes) and ~17 req/s decode-heavy at 256 in flight (~17k output tokens/s; a 1k-token answer
# takes ~5 s alone, ~14 s at that load); the 160 prompts per decode-heavy point keep the run short
# and so stay below the 256 sequences the workers admit.
SWEEP_LAYOUTS=${SWEEP_LAYOUTS:-mixed=deploy/layouts/h200-mixed.yaml 1p1d-ipc=deploy/layouts/h200-1p1d.yaml}
SWEEP_WORKLOADS=${SWEEP_WORKLOADS:-prefill:2048:128:64:4,8,12,16,20,24 decode:128:1024:160:5,10,20,40}
SWEEP_GOODPUT=${SWEEP_GOODPUT:-ttft:500 tpot:25}
SWEEP_DEADLINE_S=${SWEEP_DEADLINE_S:-525}
SWEEP_PORT=${SWEEP_PORT:-8000}

# Seconds a piece may run: `limit`, cut to what is left before the deadline less `reserve`.
sweep_limit() {  # limit reserve
  local left=$((SWEEP_DEADLINE_S - SECONDS - $2))
  if [ "$left" -lt "$1" ]; then echo $((left > 0 ? left : 0)); else echo "$1"; fi
}

sweep_stop() {  # pid: SIGTERM (the server drains and stops its workers), SIGKILL after 20 s
  local pid=$1
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 40); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

sweep_layout() {  # name layout-file; results in $RES/$preset-NAME-WORKLOAD-*
  local name=$1 file=$2 lim pid t0 wl wname in out n rates nominal
  local slog=$LOGS/sweep_serve_${name}_$preset.log
  lim=$(sweep_limit 150 60)
  if [ "$lim" -lt 30 ]; then
    note "sweep $name $preset: skipped, $((SWEEP_DEADLINE_S - SECONDS)) s left"
    return
  fi
  $S/bin/tandem serve --layout "$file" --model "$m" --port "$SWEEP_PORT" --ready-timeout-s "$lim" \
    --log-dir "$LOGS/sweep_serve_${name}_$preset" >"$slog" 2>&1 &
  pid=$!
  t0=$SECONDS
  until curl -sf "http://127.0.0.1:$SWEEP_PORT/ready" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null || [ $((SECONDS - t0)) -ge "$lim" ]; then
      note "sweep $name $preset: not serving after $((SECONDS - t0)) s ($file)"
      tail -5 "$slog" >>"$OUT/summary.txt"
      sweep_stop "$pid"
      return
    fi
    sleep 0.5
  done
  note "sweep $name $preset: serving after $((SECONDS - t0)) s ($file)"
  for wl in $SWEEP_WORKLOADS; do
    IFS=: read -r wname in out n rates <<<"$wl"
    # Its own limit: 1.5 x (arrivals + ~15 ms per output token of each point's last request) +
    # 20 s; cut to the deadline less 40 s (the next layout's start, the reports).
    nominal=$(python3 -c "import sys; r=[float(x) for x in sys.argv[3].split(',')];
print(int(1.5*sum(int(sys.argv[1])/x + 0.015*int(sys.argv[2]) for x in r) + 20))" "$n" "$out" "$rates")
    lim=$(sweep_limit "$nominal" 40)
    if [ "$lim" -lt 10 ]; then
      note "sweep $name $wname $preset: skipped, $((SWEEP_DEADLINE_S - SECONDS)) s left"
      continue
    fi
    # shellcheck disable=SC2086
    timeout -s INT -k 15 "$lim" $S/bin/tandem-loadgen --base-url "http://127.0.0.1:$SWEEP_PORT" \
      --tokenizer "$m" --num-prompts "$n" --random-input-len "$in" --random-output-len "$out" \
      --sweep "rate=$rates" --goodput $SWEEP_GOODPUT --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,90,99 --request-timeout 120 --seed 1 --label "$name" \
      --metadata "layout=$file" --metadata "workload=$wname ${in} in / ${out} out" \
      --result-dir "$RES" --result-filename "$preset-$name-$wname" --disable-progress \
      >"$LOGS/sweep_${name}_${wname}_$preset.log" 2>&1
    note "sweep $name $wname $preset: exit=$? (limit $lim s)"
  done
  curl -sf "http://127.0.0.1:$SWEEP_PORT/metrics" >"$LOGS/sweep_metrics_${name}_$preset.txt"
  sweep_stop "$pid"
}

# One comparison report per workload, the table of every point, and the results archive.
sweep_reports() {
  local wl wname l f files all=()
  for wl in $SWEEP_WORKLOADS; do
    wname=${wl%%:*}
    files=()
    for l in $SWEEP_LAYOUTS; do
      f=$RES/$preset-${l%%=*}-$wname-sweep.json
      [ -f "$f" ] && files+=("$f")
    done
    all+=("${files[@]}")
    if [ ${#files[@]} -eq 0 ]; then
      note "sweep $wname $preset: no results"
      continue
    fi
    timeout 60 $S/bin/tandem-loadgen --compare "${files[@]}" \
      --report "$OUT/sweep_${preset}_${wname}.html" >>"$LOGS/sweep_compare.log" 2>&1
    note "sweep $wname $preset: report exit=$? ($(basename "$OUT/sweep_${preset}_${wname}.html"))"
  done
  python3 engine/bench/sweep_table.py --goodput "$SWEEP_GOODPUT" --workloads "$SWEEP_WORKLOADS" \
    "${all[@]}" >"$OUT/sweep_summary_$preset.txt" 2>&1
  cat "$OUT/sweep_summary_$preset.txt" >>"$OUT/summary.txt"
}

for preset in $PRESETS; do
  m=$MODELS/$preset
  # `quant` and `abactq` alone make their own (quantized) checkpoints, the tests their small ones.
  if [ ! -f "$m/config.json" ] && ! only_named quant abactq faults tests attn_tc; then
    /usr/bin/time -f "make-model $preset: %e s" $S/bin/tandem make-model --preset "$preset" \
      --out "$m" >"$LOGS/make_$preset.log" 2>&1
    note "$(tail -1 "$LOGS/make_$preset.log")"
  fi
  if want bench; then
    timeout 300 $S/bin/tandem bench --model "$m" --json "$LOGS/bench_$preset.json" \
      --scenarios "${BENCH_SCENARIOS:-latency,decode,prefill,throughput}" --decode-tokens 32 \
      >"$LOGS/bench_$preset.log" 2>&1
    note "bench $preset exit=$?"
    grep -E "^(bench|latency|decode|prefill|throughput)|captured|KV cache|device memory" \
      "$LOGS/bench_$preset.log" >>"$OUT/summary.txt"
    # BENCH_SYNC_SCENARIOS: the same scenarios again with async scheduling off.
    if [ -n "${BENCH_SYNC_SCENARIOS:-}" ]; then
      timeout 300 $S/bin/tandem bench --model "$m" --no-async-scheduling \
        --json "$LOGS/bench_sync_$preset.json" --scenarios "$BENCH_SYNC_SCENARIOS" \
        --decode-tokens 32 >"$LOGS/bench_sync_$preset.log" 2>&1
      note "bench --no-async-scheduling $preset exit=$?"
      grep -E "^(latency|decode|prefill|throughput)" "$LOGS/bench_sync_$preset.log" \
        >>"$OUT/summary.txt"
    fi
  fi
  if want quant; then
    if [ ! -f "$LOGS/kb_quant.log" ]; then
      # The quantized kernels alone at the 8B layer shapes: skinny GEMM (m = 1, 2, 4, 8), the
      # prefill path's dequantization, and dequantization + bf16 GEMM (m = 8, 16, 32), TB/s of
      # the quantized bytes.
      timeout 120 $S/bin/kb_bench - quant >"$LOGS/kb_quant.log" 2>&1
      note "kb_bench quant exit=$?"
      grep -E "^(quant_gemm|quant_dequant)|ceiling" "$LOGS/kb_quant.log" >>"$OUT/summary.txt"
    fi
    # Pre-quantized random checkpoints of the preset's shapes (QUANTS, default "int8 awq
    # fp8-block"; make-model --quantization), each benched like the bf16 one: batch-1 latency and
    # decode, the quantized GEMMs' op profile at batch 1 and 64 (skinny kernel <= 8 tokens,
    # dequantize + bf16 GEMM above). QUANT_BENCH_ARGS: more `tandem bench` flags (e.g.
    # --batch-sizes 8,64 --contexts 1024); QUANT_PROFILE=0 skips the op profile.
    for q in ${QUANTS:-int8 awq fp8-block}; do
      mq=$MODELS/$preset-$q
      if [ ! -f "$mq/config.json" ]; then
        /usr/bin/time -f "make-model $preset $q: %e s" $S/bin/tandem make-model \
          --preset "$preset" --quantization "$q" --out "$mq" >"$LOGS/make_${preset}_$q.log" 2>&1
        note "$(tail -1 "$LOGS/make_${preset}_$q.log")"
      fi
      timeout 300 $S/bin/tandem bench --model "$mq" --json "$LOGS/bench_${preset}_$q.json" \
        --scenarios "${QUANT_SCENARIOS:-latency,decode,prefill}" --decode-tokens 32 \
        ${QUANT_BENCH_ARGS:-} >"$LOGS/bench_${preset}_$q.log" 2>&1
      note "bench $preset $q exit=$?"
      grep -E "^(bench|latency|decode|prefill|throughput)|captured|KV cache|device memory|weights" \
        "$LOGS/bench_${preset}_$q.log" >>"$OUT/summary.txt"
      if [ "${QUANT_PROFILE:-1}" != 0 ]; then
        TANDEM_OP_PROFILE=20 timeout 120 $S/bin/tandem bench --model "$mq" \
          --scenarios latency,decode --latency-tokens 64 --batch-sizes 64 --contexts 1024 \
          --decode-tokens 48 >"$LOGS/profile_${preset}_$q.log" 2>&1
        note "profile $preset $q exit=$?"
        grep -E "qgemm|quant act|op profile" "$LOGS/profile_${preset}_$q.log" | head -40 \
          >>"$OUT/summary.txt"
      fi
      rm -rf "$mq"  # 5-9 GB each; the disk holds the bf16 checkpoints too
    done
  fi
  if want abnorm; then
    # Batch-1 latency with the RMSNorm fused into the skinny GEMM (TANDEM_FUSED_NORM=1) and
    # without (the default), interleaved twice so the spread between runs of one tree shows.
    for round in 1 2; do
      for fused in 1 0; do
        TANDEM_FUSED_NORM=$fused timeout 120 $S/bin/tandem bench --model "$m" \
          --scenarios latency --latency-tokens 256 \
          >"$LOGS/abnorm_${preset}_fused${fused}_r$round.log" 2>&1
        note "abnorm $preset fused=$fused round $round: $(grep -E '^latency ' "$LOGS/abnorm_${preset}_fused${fused}_r$round.log" | head -1)"
      done
    done
  fi
  if named abactq; then
    # The RMSNorm fused with the FP8 activation quantization (TANDEM_FUSED_ACT_QUANT=1) against
    # the norm + the FP8 GEMM's own quantizer (=0), on the FP8 checkpoint layouts of
    # ABACTQ_QUANTS (default fp8-block; make-model fp8-channel and fp8-block, one per call fits
    # the 10 minutes): decode at batch 64 and 256 (context 1024, graphs) and one 8k prefill,
    # interleaved twice (ABACTQ_ROUNDS="1 2") so the run-to-run spread shows beside the difference.
    for q in ${ABACTQ_QUANTS:-fp8-block}; do
      mq=$MODELS/$preset-$q
      if [ ! -f "$mq/config.json" ]; then
        $S/bin/tandem make-model --preset "$preset" --quantization "$q" --out "$mq" \
          >"$LOGS/make_${preset}_$q.log" 2>&1
      fi
      for round in ${ABACTQ_ROUNDS:-1 2}; do
        for fused in 1 0; do
          log=$LOGS/abactq_${preset}_${q}_fused${fused}_r$round.log
          TANDEM_FUSED_ACT_QUANT=$fused timeout 240 $S/bin/tandem bench --model "$mq" \
            --scenarios decode,prefill --batch-sizes 64,256 --contexts 1024 --decode-tokens 48 \
            --prefill-lens 8192 --json "${log%.log}.json" >"$log" 2>&1
          note "abactq $preset $q fused=$fused round $round exit=$?: $(grep -E '^(decode|prefill) ' "$log" | tr '\n' ' ')"
        done
      done
      rm -rf "$mq"
    done
  fi
  if want profile; then
    # Op profile: every 20th step of a batch-1 and a batch-64 decode runs op by op with events.
    TANDEM_OP_PROFILE=20 timeout 120 $S/bin/tandem bench --model "$m" \
      --scenarios latency,decode --latency-tokens 64 --batch-sizes 64 --contexts 1024 \
      --decode-tokens 48 >"$LOGS/profile_$preset.log" 2>&1
    note "profile $preset exit=$?"
  fi
  if want trace; then
    # A CUPTI timeline of graph-replayed decode steps (tools/gpu/kernel_trace): batch 1, then
    # batch 64 at context 1024; per-kernel time added to the step, overlap included.
    # TRACE_FUSED="1 0" traces batch 1 with and without the norm fused into the GEMM (default: 0).
    kt=$PWD/$S/trace/libtandem_kernel_trace.so
    shapes=()
    for f in ${TRACE_FUSED:-0}; do
      shapes+=("b1_fused$f:$f:--scenarios latency --latency-tokens 64")
    done
    shapes+=("b64:0:--scenarios decode --batch-sizes 64 --contexts 1024 --decode-tokens 48")
    for shape in "${shapes[@]}"; do
      tag=${shape%%:*} rest=${shape#*:}
      fused=${rest%%:*} flags=${rest#*:}
      # shellcheck disable=SC2086
      TANDEM_FUSED_NORM=$fused CUDA_INJECTION64_PATH=$kt \
        TANDEM_KERNEL_TRACE=$LOGS/trace_${tag}_$preset.csv timeout 150 \
        $S/bin/tandem bench --model "$m" $flags >"$LOGS/trace_${tag}_$preset.log" 2>&1
      note "trace $tag $preset exit=$?: $(grep -E '^(latency|decode) ' "$LOGS/trace_${tag}_$preset.log" | head -2 | tr '\n' ' ')"
      python3 tools/gpu/kernel_trace/step_timeline.py "$LOGS/trace_${tag}_$preset.csv" \
        --json "$LOGS/timeline_${tag}_$preset.json" >>"$OUT/summary.txt" 2>&1
      gzip -f "$LOGS/trace_${tag}_$preset.csv"
    done
  fi
  if want ncu; then
    # Every kernel of graph-replayed batch-1 decode steps, timed by ncu one by one.
    timeout 150 ncu --clock-control none --graph-profiling node --launch-skip 1500 \
      --launch-count 600 --metrics gpu__time_duration.sum --csv \
      $S/bin/tandem bench --model "$m" --scenarios latency --latency-tokens 24 \
      --max-num-seqs 8 --cuda-graph-sizes 1 >"$LOGS/ncu_$preset.csv" 2>"$LOGS/ncu_$preset.err"
    note "ncu $preset exit=$?"
    python3 engine/bench/ncu_step_table.py "$LOGS/ncu_$preset.csv" >>"$OUT/summary.txt" 2>&1
  fi
  # SERVED_ASYNC="1 0": async scheduling on (the default), then off.
  if want served; then
    for a in ${SERVED_ASYNC:-1}; do serve_and_load h200-mixed 256 "$a"; done
  fi
  # Prefill and decode workers sharing the GPU, pages by CUDA IPC (the layout's kv_transport).
  if want served1p1d; then serve_and_load h200-1p1d 32; fi
  if want peer; then
    # The peer (transformers + StaticCache + torch.compile) beside tandem at the shapes it runs:
    # batch 1 and 64, contexts from 128 to ~520.
    timeout 150 python3 engine/bench/peer_hf_compile.py --model "$m" \
      --batch-sizes "${PEER_BATCHES:-1,64}" >"$LOGS/peer_hf_$preset.jsonl" 2>"$LOGS/peer_hf_$preset.err"
    note "peer transformers $preset exit=$?: $(cat "$LOGS/peer_hf_$preset.jsonl" | tr '\n' ' ')"
    tail -3 "$LOGS/peer_hf_$preset.err" >>"$OUT/summary.txt"
    timeout 120 $S/bin/tandem bench --model "$m" --scenarios decode --batch-sizes 1,64 \
      --contexts 128,512 --decode-tokens 128 >"$LOGS/peer_tandem_$preset.log" 2>&1
    note "tandem at the peer's shapes $preset exit=$?"
    grep -E "^decode " "$LOGS/peer_tandem_$preset.log" >>"$OUT/summary.txt"
  fi
  if want spec; then
    # Speculative decoding, n-gram proposals over prompts that repeat a 16-token phrase: decode
    # steps at batch 1, 8, 32 (context 1024) without speculation and with k = SPEC_KS proposals
    # per sequence; each row's spec line has the measured acceptance (engine/spec/README.md).
    for k in 0 ${SPEC_KS:-1 2 4 8}; do
      flags=()
      [ "$k" -gt 0 ] && flags=(--speculative-method ngram --num-speculative-tokens "$k")
      timeout 150 $S/bin/tandem bench --model "$m" --scenarios decode --batch-sizes 1,8,32 \
        --contexts 1024 --prompt-period 16 --decode-tokens 64 "${flags[@]}" \
        --json "$LOGS/spec_k${k}_$preset.json" >"$LOGS/spec_k${k}_$preset.log" 2>&1
      note "spec ngram k=$k $preset exit=$?"
      grep -E "^decode |speculative:" "$LOGS/spec_k${k}_$preset.log" >>"$OUT/summary.txt"
    done
    # SPEC_DRAFT=1 (Llama 3 shapes): a Llama-3.2-1B-shaped random draft, its own decode steps
    # (the draft's cost per proposal) and k = 4 drafted steps (random weights: the two models
    # agree on next to nothing, so this measures cost, not acceptance).
    if [ "${SPEC_DRAFT:-0}" = 1 ]; then
      dm=$MODELS/llama32-1b
      [ -f "$dm/config.json" ] || $S/bin/tandem make-model --preset llama32-1b --out "$dm" \
        >"$LOGS/make_llama32-1b.log" 2>&1
      timeout 120 $S/bin/tandem bench --model "$dm" --scenarios decode --batch-sizes 1,8,32 \
        --contexts 1024 --decode-tokens 64 >"$LOGS/spec_draft_alone.log" 2>&1
      note "draft llama32-1b alone exit=$?"
      grep -E "^decode " "$LOGS/spec_draft_alone.log" >>"$OUT/summary.txt"
      timeout 150 $S/bin/tandem bench --model "$m" --scenarios decode --batch-sizes 1,8 \
        --contexts 1024 --prompt-period 16 --decode-tokens 64 --speculative-method draft \
        --speculative-draft-model "$dm" --num-speculative-tokens 4 \
        --json "$LOGS/spec_draft_k4_$preset.json" >"$LOGS/spec_draft_k4_$preset.log" 2>&1
      note "spec draft k=4 $preset exit=$?"
      grep -E "^decode |speculative:" "$LOGS/spec_draft_k4_$preset.log" >>"$OUT/summary.txt"
    fi
    # SPEC_DRAFT_SELF=1: the target as its own draft (a draft that always agrees, at the target's
    # cost): the draft path's acceptance and rollback on the GPU, and its cost at acceptance 1.
    if [ "${SPEC_DRAFT_SELF:-0}" = 1 ]; then
      timeout 150 $S/bin/tandem bench --model "$m" --scenarios decode --batch-sizes 1,8 \
        --contexts 1024 --decode-tokens 64 --speculative-method draft \
        --speculative-draft-model "$m" --num-speculative-tokens 4 \
        --json "$LOGS/spec_self_k4_$preset.json" >"$LOGS/spec_self_k4_$preset.log" 2>&1
      note "spec draft=self k=4 $preset exit=$?"
      grep -E "^decode |speculative:" "$LOGS/spec_self_k4_$preset.log" >>"$OUT/summary.txt"
    fi
  fi
  # Prefix caching and KV-aware routing on one GPU (deploy/layouts/h200-2p1d.yaml: 2 prefill + 1
  # decode workers, KV over CUDA IPC): loadgen/measure_prefix_cache.sh's three runs of the
  # multi-turn workload (cache on / off with least-loaded routing, cache on with kv-aware), its
  # table last in the summary. Only when asked for by name (not part of `all`). Its knobs pass
  # through (SYSTEM_LEN, NUM_PROMPTS, CONCURRENCY, ...; defaults sized for ~1 minute a run).
  if [[ " $what " == *" prefix "* ]]; then
    SYSTEM_LEN=${SYSTEM_LEN:-2048} NUM_PROMPTS=${NUM_PROMPTS:-128} CONCURRENCY=${CONCURRENCY:-16} \
      REQUEST_TIMEOUT_S=${REQUEST_TIMEOUT_S:-120} \
      timeout 540 loadgen/measure_prefix_cache.sh "$S" deploy/layouts/h200-2p1d.yaml "$m" \
      "$LOGS/prefix_$preset" >"$LOGS/prefix_$preset.log" 2>&1
    note "prefix cache $preset exit=$?"
    grep -E "^(== |Successful|Failed)|did not come up|exited with" "$LOGS/prefix_$preset.log" \
      >>"$OUT/summary.txt"
    prefix_tables+=$'\n'"prefix cache, $preset:"$'\n'"$(grep -E '^\|' "$LOGS/prefix_$preset.log")"
  fi
  if named sweep; then
    RES=$OUT/sweep
    mkdir -p "$RES"
    for l in $SWEEP_LAYOUTS; do sweep_layout "${l%%=*}" "${l#*=}"; done
    sweep_reports
  fi
  if want hf; then
    TANDEM_REF_PYTHON=python3 TANDEM_HF_PRESETS=$preset TANDEM_HF_MODEL_DIR=$m \
      run_test engine_cuda_test 300 \
      --gtest_filter='*MatchesTransformersInBf16*'
    grep -E "max \|cuda|greedy tokens" "$LOGS/engine_cuda_test.log" >>"$OUT/summary.txt"
  fi
done

# The sweep's JSON / CSV per point and per sweep and each layout's own report, in one archive
# (the comparison reports and the table stay beside it).
if [ -d "$OUT/sweep" ]; then tar -C "$OUT" -czf "$OUT/sweep_results.tgz" sweep && rm -rf "$OUT/sweep"; fi
tar -C "$OUT" -czf "$OUT/logs${LOGTAG:-}.tgz" logs && rm -rf "$LOGS"
echo "===== summary"
cat "$OUT/summary.txt"
if [ -n "$prefix_tables" ]; then echo "$prefix_tables"; fi
