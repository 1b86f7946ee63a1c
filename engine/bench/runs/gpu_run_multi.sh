#!/usr/bin/env bash
# The runs of issue 22 ([multi-gpu]) that need two (or four) GPUs of one host (nvidia-h200-x2):
# one mode per 600 s call (or two short ones: `pp mixed`), every step under a timeout cut to what
# is left before MULTI_DEADLINE_S (default 560 s after the script started), most important step
# first, so that a call cut short still brings back what finished; the short table last, every
# log and layout in $OUT/logs_<modes>.tgz. Of the 8 files a call brings back this leaves
# summary.txt, logs_<modes>.tgz and, for disagg, the two HTML reports. Order of the calls if
# only some are lent: kv, tp, disagg, `pp mixed`. Estimates from earlier runs' start-ups
# (make-model 8B ~35-45 s, an 8B worker ready in ~15-20 s, a `tandem bench` ~45-65 s).
#   kv      NCCL KV transfer, prefill worker on GPU 0, decode worker on GPU 1 (kv_transport nccl,
#           as deploy/layouts/h200x2.yaml with `auto`): nccl_kv_gpu_test (the 8k-token Qwen3-8B KV,
#           1.2 GB, scattered / contiguous / layer-wise, bytes exact: effective GB/s), then the
#           same test on NCCL's socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1); served
#           with Qwen3-8B shapes: 64 greedy prompts (1-300 tokens, 12 out, one at a time) through
#           1P1D over NCCL against a mixed worker on GPU 0, output by output; the prefill workers'
#           KV metrics for 2k and 8k prompts (span, bytes -> GB/s, exposed time vs prefill time);
#           three faults while 8k prompts' KV is in flight (client cancel, SIGKILL of the decode
#           worker, SIGKILL of the prefill worker): every client answered (no hang), service
#           back, no page held on either worker (metrics), the communicator aborted (log) and a
#           later transfer over NCCL again (metrics); then 1P1D over NCCL's socket transport
#           (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1, loopback TCP as a stand-in
#           for two nodes) with the layer-wise push on and off (--no-kv-layerwise-push), and P2P
#           with it off (the span is then the transfer alone: the served GB/s): GB/s and exposed
#           time for 2k and 8k prompts; NCCL_DEBUG=INFO names each run's transport. (~350-480 s)
#   tp      TP 2 over NCCL on GPUs 0-1: nccl_communicator_gpu_test (2 GPUs: all-reduce,
#           all-gather, captured in a graph, a missing rank, its all-reduce time),
#           engine_cuda_tp_test (TP 2 over NCCL on GPUs 0, 1 against TP 1; its other tests
#           pin the ranks to GPU 0), served TP 2 (gpus [0, 1]) against TP 1, 64 greedy prompts (small-qwen3: equal up to
#           near ties, bf16 partial sums); `tandem bench` Llama-3-8B shapes, batch-1 latency and
#           256 x (128 in / 1024 out) throughput at TP 1, TP 2 with CUDA graphs, TP 2
#           --enforce-eager; op profile (TANDEM_OP_PROFILE=20) at batch 1 and 64, TP 1 and 2:
#           span - ops of the eager steps, where the all-reduces are.               (~350-450 s)
#   pp      engine_cuda_pp_test (PP 2 on GPUs 0, 1 against one GPU; the others on GPU 0),
#           served PP 2 (gpus [0, 1]) against PP 1 on 64 greedy prompts (small-qwen3; a layer split does not change the arithmetic: equal),
#           `tandem bench` Llama-3-8B latency + throughput at PP 1, PP 2 with one micro-batch per
#           stage (the default, stages overlap) and --pipeline-micro-batches 1 (no overlap).
#                                                                                    (~250-330 s)
#   disagg  1P1D (prefill GPU 0, decode GPU 1, NCCL) against two mixed workers (one per GPU),
#           Qwen3-8B shapes bf16: engine/bench/gpu_run_engine.sh sweep with these two layouts,
#           prefill-heavy 2048 in / 128 out and decode-heavy 128 in / 1024 out Poisson rate
#           sweeps, goodput under TTFT <= 500 ms / TPOT <= 25 ms, sweep_table.py's table, one
#           HTML report per workload into $OUT. Rates go higher than on one GPU (two GPUs'
#           capacity); SWEEP_WORKLOADS replaces them. Its servers are gpu_run_engine.sh's (the same
#           launcher; their environment is not checked there).              (~400 s, bound 545)
#   mixed   prefill TP 1 (GPU 0) -> decode TP 2 (GPUs 0-1) on x2, or prefill TP 2 (GPUs 0-1) ->
#           decode TP 1 (GPU 2) on x4 (picked by the GPU count): groups of different sizes, so
#           the KV goes over TCP (auto; nccl / ipc copy pages unchanged and are refused for
#           them); 64 greedy prompts against a mixed TP 1 worker (small-qwen3; equal up to near
#           ties: the TP 2 side sums partials in another order), pages free after.   (~90-150 s)
#   tests   named test binaries of the pack: TESTS="bin[:gtest filter] ..." (TP_TESTS / PP_TESTS
#           replace tp's and pp's lists).
#
# NVLink multicast stays off in every process: tools/gpu/gpu-env.sh exports NCCL_NVLS_ENABLE=0
# (and TORCH_SYMM_MEM_DISABLE_MULTICAST / NVSHMEM_DISABLE_NVLS); `tandem serve` starts its router
# and workers with the launcher's environment plus their own variables (child_process.cc: setenv
# over the inherited environment, then execv), and `tandem bench` / the tests are children of
# this shell. Every served step checks it: each process `tandem serve` started has
# NCCL_NVLS_ENABLE=0 in /proc/PID/environ ("nvls off in N of N processes" in the summary).
# Nothing here changes clocks, power, MIG or persistence, or resets a GPU.
#
# What the product lacks for the issue's runs (left as it is; what this script does instead):
#   - disagg_equality_gpu_test and fault_transfer_gpu_test put both workers on GPU 0 with
#     kv_transport ipc (their layouts are compiled in, no switch picks two GPUs or nccl): the
#     NCCL equality and fault runs are done here through `tandem serve` + tandem-loadgen instead,
#     comparing the loadgen's detailed outputs (generated text of greedy tokens: equal tokens give
#     equal text; the API returns no token ids), and faulting at a time, not at a held transfer
#     (an 8k prompt is one chunk with max_num_batched_tokens 8192, so its layer-wise push runs for
#     the whole ~0.2 s prefill step, and steps follow back to back at concurrency 3).
#   - No log line or metric says an NCCL KV communicator was built (only "aborting communicator
#     generation N" is logged): "rebuilt" is read as: an abort logged, then transfers counted
#     with path nccl after the fault.
#   - --kv-transfer-hold-ms holds a transfer after its sends completed, so a fault there keeps
#     the communicator (nothing outstanding): it cannot hold an NCCL transfer mid-flight.
#   - (Closed after this script was written: engine_cuda_tp_test's
#     TensorParallelOnTwoGpusOverNcclMatchesTp1 and engine_cuda_pp_test's
#     PipelineStagesOnTwoGpusMatchTheSingleGpuModel compare TP 2 / PP 2 over NCCL, on GPUs 0 and
#     1, against TP 1's logits, and TP 2's engine with graphs against TP 1's tokens; they skip
#     with one GPU. The other tests of those binaries pin every rank to GPU 0.)
#   - The op profile (TANDEM_OP_PROFILE) times the Ops calls only; a TP rank's all-reduce goes to
#     its communicator directly and has no row: "span - ops" of a profiled eager step is the
#     upper bound reported (TP 2's minus TP 1's is the all-reduces' share).
#   - The launcher sets no per-group environment: the NCCL socket switches of a served run reach
#     every process of the layout (the router too, harmlessly); `tandem bench` takes TP / PP from
#     its own flags (--tensor-parallel-size, --pipeline-parallel-size, --pipeline-micro-batches;
#     rank r on visible GPU r), --enforce-eager is the switch that forces TP 2 eager.
#
# Staged here (one pack, 64 MiB carried at most; stage_pack.sh prints its size), carry
# [".gpu-packmg"]:
#   PACK=.gpu-packmg BINS="tandem tandem-router tandem-decode-worker tandem-prefill-worker
#     tandem-loadgen" TEST_BINS="nccl_kv_gpu_test nccl_communicator_gpu_test engine_cuda_tp_test
#     engine_cuda_pp_test" engine/bench/runs/stage_pack.sh
# (41 MB packed, 200 MB unpacked, staged from build/ with NO_BUILD=1 on 2026-12-04). Usage there:
#   [PACK=.gpu-packmg] engine/bench/runs/gpu_run_multi.sh kv|tp|pp|disagg|mixed|tests...
# A dry run of the same steps on the CPU backend here (the build folder's binaries, the tiny
# preset, layouts with backend cpu and no GPU lists, kv_transport tcp where the GPU run says
# nccl, smaller prompts; GPU tests run and skip):
#   DRY_RUN=cpu engine/bench/runs/gpu_run_multi.sh kv        (MULTI_PORT, default 18500 there)
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
modes="$*"
mode=${modes// /+}
tag=$mode  # the logs archive's name
for a in "$@"; do
  case "$a" in
    kv | tp | pp | disagg | mixed | tests) ;;
    *) set -- ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: [DRY_RUN=cpu] $0 kv|tp|pp|disagg|mixed|tests..." >&2
  exit 2
fi
DRY=${DRY_RUN:-}
if [ "$DRY" = cpu ]; then
  S=${TANDEM_STAGE:-build}
  OUT=${OUT:-/tmp/multi-dry-out}
  MODELS=${MODELS:-/tmp/multi-dry-models}
  PORT=${MULTI_PORT:-18500}
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
else
  S=.gpu-eng
  # A warm machine keeps the last call's .gpu-eng: unpack again when it came from another pack.
  PACK=${PACK:-.gpu-packmg}
  if [ "$(cat "$S/.pack" 2>/dev/null)" != "$PACK" ]; then
    rm -rf "$S" && tar -xJf "$PACK/eng.tar.xz" && echo "$PACK" >"$S/.pack"
  fi
  OUT=${OUT:-/tmp/multi-out}
  MODELS=${MODELS:-/tmp/tandem-models}
  PORT=${MULTI_PORT:-8000}
  source tools/gpu/gpu-env.sh --libs $S/_libs --info  # NVLink multicast off, CUDA paths
fi
export PYTHONUNBUFFERED=1 TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY_DIR=$PWD/$S
LOGS=$OUT/logs
mkdir -p "$LOGS" "$MODELS"
DEADLINE=${MULTI_DEADLINE_S:-560}
PY="python3 engine/bench/runs/gpu_run_multi.py"
source engine/bench/runs/run_lib.sh  # note, run_test, run_named_tests
: >"$OUT/table.txt"
row() { printf '| %s | %s | %s |\n' "$1" "$2" "$3" >>"$OUT/table.txt"; }
verdict() {  # gtest log -> "PASSED 3 SKIPPED 1 FAILED 0"-like summary, or why there is none
  local v
  v=$(grep -hoE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+' "$1" 2>/dev/null | tr -s ' []' ' ' | tr '\n' ' ')
  echo "${v:-no verdict (exit or timeout; see the log)}"
}
if [ -z "$DRY" ]; then
  nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm,power.draw \
    --format=csv >"$LOGS/smi.txt" 2>&1
  nvidia-smi topo -m >>"$LOGS/smi.txt" 2>&1
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
  NGPU=0
fi
note "modes $modes, ${DRY:+dry run: }$NGPU GPUs, NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset}"

# Seconds a step may run: $1, cut to what is left before the deadline less $2 (default 10).
lim() {
  local left=$((DEADLINE - SECONDS - ${2:-10}))
  if [ "$left" -lt "$1" ]; then echo $((left > 0 ? left : 0)); else echo "$1"; fi
}
# True (and a note) when fewer than $1 seconds are left for step $2.
short() {
  if [ "$(lim "$1" 0)" -lt "$1" ]; then
    note "$2: skipped, $((DEADLINE - SECONDS)) s left"
    row "$2" "skipped" "$((DEADLINE - SECONDS)) s left"
    return 0
  fi
  return 1
}

# --- models and layouts -------------------------------------------------------------------------
make_model() {  # preset -> sets m (CPU dry run: the tiny preset for every one)
  local preset=$1
  [ -n "$DRY" ] && preset=tiny
  m=$MODELS/$preset
  if [ ! -f "$m/config.json" ]; then
    /usr/bin/time -f "make-model $preset: %e s" $S/bin/tandem make-model --preset "$preset" \
      --out "$m" >"$LOGS/make_$preset.log" 2>&1
    note "$(tail -1 "$LOGS/make_$preset.log")"
  fi
}

# A layout file $OUT/layouts/NAME.yaml: engine block $ENGINE (a YAML flow body), kv_transport
# $KV (default nccl; tcp in the dry run), then the groups given as arguments, each
# "role:count:tp:pp:gpus[:args]" (gpus "0,1"; args "--a,b,--c": YAML list items). The dry run
# drops the GPU lists and sets backend cpu.
layout() {
  local name=$1 f
  shift
  f=$OUT/layouts/$name.yaml
  mkdir -p "$OUT/layouts"
  local kv=${KV:-nccl}
  [ -n "$DRY" ] && kv=tcp
  {
    echo "# gpu_run_multi.sh $mode: $name"
    echo "model: \"\""
    if [ -n "$DRY" ]; then echo "backend: cpu"; else echo "backend: cuda"; fi
    echo "host: 127.0.0.1"
    echo "kv_transport: $kv"
    echo "router: {port: $PORT, grpc_port: 0}"
    if [ -n "$DRY" ]; then
      echo "engine: {page_size: 16, kv_memory_bytes: 268435456, max_num_seqs: 64, max_num_batched_tokens: 1024${ENGINE_CPU:+, $ENGINE_CPU}}"
    else
      echo "engine: {page_size: 16, max_num_seqs: 256, max_num_batched_tokens: 8192${ENGINE:+, $ENGINE}}"
    fi
    echo "groups:"
    local g role count tp pp gpus args
    for g in "$@"; do
      IFS=: read -r role count tp pp gpus args <<<"$g"
      printf '  - {role: %s, count: %s, tensor_parallel: %s, pipeline_parallel: %s' \
        "$role" "$count" "$tp" "$pp"
      [ -n "$gpus" ] && [ -z "$DRY" ] && printf ', gpus: [%s]' "${gpus//,/, }"
      [ -n "$args" ] && printf ', args: [%s]' "$(echo "$args" | sed -E 's/([^,]+)/"\1"/g; s/,/, /g')"
      echo "}"
    done
  } >"$f"
  echo "$f"
}

# --- tandem serve ------------------------------------------------------------------------------
SERVE_PID=""
SERVE_NAME=""
# name layout-file [ENV=V...]: serves $m on $PORT until ready (or the limit); 0 when serving.
serve_up() {
  local name=$1 file=$2 t0 l
  shift 2
  SERVE_NAME=$name
  l=$(lim 180 30)
  env "$@" $S/bin/tandem serve --layout "$file" --model "$m" --port "$PORT" --ready-timeout-s "$l" \
    --log-dir "$LOGS/serve_$name" >"$LOGS/serve_$name.out" 2>&1 &
  SERVE_PID=$!
  t0=$SECONDS
  until curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1 &&
    grep -q "ready at" "$LOGS/serve_$name.out"; do
    if ! kill -0 "$SERVE_PID" 2>/dev/null || [ $((SECONDS - t0)) -ge "$l" ]; then
      note "serve $name: not serving after $((SECONDS - t0)) s"
      tail -5 "$LOGS/serve_$name.out" >>"$OUT/summary.txt"
      row "serve $name" "FAIL" "not serving after $((SECONDS - t0)) s"
      serve_down
      return 1
    fi
    sleep 0.5
  done
  note "serve $name: serving after $((SECONDS - t0)) s ($(basename "$file")); $(nvls_check)"
  return 0
}
serve_down() {  # SIGTERM (drains, stops the workers), SIGKILL after 20 s
  [ -n "$SERVE_PID" ] || return 0
  kill -TERM "$SERVE_PID" 2>/dev/null
  for _ in $(seq 40); do
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$SERVE_PID" 2>/dev/null
  wait "$SERVE_PID" 2>/dev/null
  SERVE_PID=""
}
trap serve_down EXIT
# Every process the launcher started has NCCL_NVLS_ENABLE=0 in its environment.
# Also the other NCCL_* variables they all have (the socket runs' switches).
nvls_check() {
  local pid n=0 ok=0 env pids
  pids=$(ps -o pid= --ppid "$SERVE_PID" 2>/dev/null)
  for pid in $pids; do
    n=$((n + 1))
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'NCCL_NVLS_ENABLE=0' && ok=$((ok + 1))
  done
  env=$(for pid in $pids; do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -E '^NCCL_' | grep -v NVLS
  done | sort | uniq -c | awk -v n="$n" '$1 == n {print $2}' | tr '\n' ' ')
  echo "nvls off in $ok of $n processes${env:+; all have $env}"
}
# The pid of the serving launcher's child ROLE-0 (prefill, decode), now (restarts change it).
worker_pid() {
  local pid
  for pid in $(ps -o pid= --ppid "$SERVE_PID" 2>/dev/null); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--worker-id $1-0"; then
      echo "$pid"
      return
    fi
  done
}
# Every worker's /metrics into FILE, each after a "# worker NAME" line (the ports stay the same
# across restarts).
scrape() {
  local url name
  : >"$1"
  grep -oE 'http://[0-9.:]+/metrics +\((prefill|decode|mixed)-[0-9]+' "$LOGS/serve_$SERVE_NAME.out" |
    while read -r url name; do
      echo "# worker ${name#(}" >>"$1"
      curl -sf -m 5 "$url" >>"$1"
    done
}
# Polls a 2-token completion until one answers 200 (up to $1 s): 0 when serving.
serving_again() {
  local t0=$SECONDS body
  body="{\"model\": \"$(basename "$m")\", \"prompt\": \"hello there\", \"max_tokens\": 2}"
  while [ $((SECONDS - t0)) -lt "$1" ]; do
    curl -sf -m 10 -o /dev/null "http://127.0.0.1:$PORT/v1/completions" \
      -H 'Content-Type: application/json' -d "$body" && return 0
    sleep 1
  done
  return 1
}

# tandem-loadgen against the served layout; tag, limit, then loadgen flags. Its JSON is
# $LOGS/lg_TAG.json.
lg() {
  local tag=$1 l=$2
  shift 2
  timeout -s INT -k 10 "$l" $S/bin/tandem-loadgen --base-url "http://127.0.0.1:$PORT" \
    --tokenizer "$m" --request-rate inf --seed 5 --save-result --save-detailed \
    --result-dir "$LOGS" --result-filename "lg_$tag.json" --disable-progress "$@" \
    >"$LOGS/lg_$tag.log" 2>&1
}
# 64 greedy prompts of 1-300 tokens (2-298: 150 +- 99%), 12 tokens each, one at a time (the
# same step shapes in both layouts, as disagg_equality_gpu_test).
equality_run() {  # tag
  local n=64 in=150 out=12
  lg "eq_$1" "$(lim 120)" --num-prompts $n --max-concurrency 1 --random-input-len $in \
    --random-range-ratio 0.99 --random-output-len $out --temperature 0 --request-timeout 60
  note "equality prompts on $SERVE_NAME exit=$?: $($PY loadgen "$LOGS/lg_eq_$1.json")"
}
equality_verdict() {  # what ref-tag tag [near]: near = bf16 sums of another order, so
  # outputs may part at a near tie (engine_cuda_tp_test's bound): a count, not PASS / FAIL
  local v rc r
  v=$($PY compare "$LOGS/lg_eq_$2.json" "$LOGS/lg_eq_$3.json" 2>&1)
  rc=$?
  note "$1: $v"
  if [ $rc = 0 ]; then
    r=PASS
  elif [ "${4:-}" = near ] && ! grep -q "failed [1-9]\|/ [1-9]" <<<"$v"; then
    r="$(cut -d' ' -f1-3 <<<"$v") identical (near ties expected)"
  else
    r=FAIL
  fi
  row "$1" "$r" "$v"
}
# Fixed-length prompts at concurrency 1 and the prefill workers' KV figures over them.
kv_load() {  # tag input-len num-prompts
  scrape "$LOGS/m_$1_0.txt"
  lg "$1" "$(lim 90)" --num-prompts "$3" --max-concurrency 1 --random-input-len "$2" \
    --random-output-len 4 --request-timeout 60
  local rc=$?
  scrape "$LOGS/m_$1_1.txt"
  local v
  v=$($PY kvdelta "$LOGS/m_$1_0.txt" "$LOGS/m_$1_1.txt" | tr '\n' ' ')
  note "kv $1 ($2-token prompts x $3) exit=$rc: $($PY loadgen "$LOGS/lg_$1.json"); $v"
  row "kv $1 ($2 in)" "$($PY loadgen "$LOGS/lg_$1.json" | cut -d' ' -f1-4)" "$v"
}

# --- kv -----------------------------------------------------------------------------------------
# One fault while long prompts' KV is in flight: cancel (the clients' request timeout) or
# SIGKILL of the prefill or decode worker. Verdict: every client answered within the bound (no
# hang), service back, no page held on any worker, and for NCCL an abort logged and transfers
# over nccl after the fault.
fault_cell() {  # cancel|prefill|decode
  local what=$1 len=$FAULT_LEN t0 pid rc lgpid back pages aborts0 aborts1 after
  local tag=fault_$what
  short 75 "fault $what" && return
  aborts0=$(cat "$LOGS/serve_$SERVE_NAME"/*.log 2>/dev/null | grep -c "aborting communicator generation")
  t0=$SECONDS
  if [ "$what" = cancel ]; then
    # Each request is given up by its client during its prefill / layer-wise push.
    lg "$tag" 60 --num-prompts 12 --max-concurrency 3 --random-input-len "$len" \
      --random-output-len 16 --request-timeout "$CANCEL_S"
    rc=$?
  else
    lg "$tag" 90 --num-prompts "$FAULT_PROMPTS" --max-concurrency 3 --random-input-len "$len" \
      --random-output-len 16 --request-timeout 60 &
    lgpid=$!
    sleep "$FAULT_AT_S"
    pid=$(worker_pid "$what")
    if [ -z "$pid" ]; then
      note "fault $what: no $what-0 process"
    else
      kill -KILL "$pid"
      note "fault $what: SIGKILL $what-0 (pid $pid) at +$((SECONDS - t0)) s"
    fi
    wait "$lgpid"
    rc=$?
  fi
  local answered=$((SECONDS - t0))
  serving_again "$(lim 120)"
  back=$?
  local back_s=$((SECONDS - t0))
  sleep 5
  scrape "$LOGS/m_${tag}.txt"
  pages=$($PY pages "$LOGS/m_${tag}.txt")
  local pages_rc=$?
  # A few transfers after the fault, then the paths they took.
  scrape "$LOGS/m_${tag}_a0.txt"
  lg "${tag}_after" 60 --num-prompts 3 --max-concurrency 1 --random-input-len "$len" \
    --random-output-len 4 --request-timeout 30
  scrape "$LOGS/m_${tag}_a1.txt"
  after=$($PY kvdelta "$LOGS/m_${tag}_a0.txt" "$LOGS/m_${tag}_a1.txt" | grep -oE "paths [^;]*" | tr '\n' ' ')
  aborts1=$(cat "$LOGS/serve_$SERVE_NAME"/*.log 2>/dev/null | grep -c "aborting communicator generation")
  local verdict=PASS
  { [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ]; } && verdict=FAIL
  [ "$back" -ne 0 ] && verdict=FAIL
  [ "$pages_rc" -ne 0 ] && verdict=FAIL
  # A kill that failed no request came after the load (or between transfers): not a test of it.
  local failed
  failed=$($PY loadgen "$LOGS/lg_$tag.json" | grep -oE 'failed [0-9]+' | cut -d' ' -f2)
  [ "$verdict" = PASS ] && [ "${failed:-0}" = 0 ] && verdict="PASS, but the fault hit no request"
  local v
  v="clients $($PY loadgen "$LOGS/lg_$tag.json") (loadgen exit $rc) by +${answered} s;"
  v+=" serving again $([ $back = 0 ] && echo "by +${back_s} s" || echo NO); $pages;"
  v+=" communicator aborts logged $((aborts1 - aborts0)); after: $after"
  note "fault $what: $verdict: $v"
  row "fault $what ($len-token prompts)" "$verdict" "$v"
}

kv() {
  # (1) The transport alone: 8k-token Qwen3-8B KV GPU 0 -> GPU 1, then on NCCL's sockets.
  # NCCL_DEBUG=INFO (INIT, NET) names the transport each channel took ("via P2P/...", "via
  # NET/Socket/..."); IB is turned off too for the socket runs, so that a host with HCAs still
  # takes TCP sockets.
  local dbg="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
  # shellcheck disable=SC2086,SC2163
  (export $dbg && run_test nccl_kv_gpu_test "$(lim 150)")
  # shellcheck disable=SC2086,SC2163
  (export $dbg $SOCKET_ENV && TAG=_socket run_test nccl_kv_gpu_test "$(lim 150)")
  local t
  for t in "" _socket; do
    grep -E "^nccl GPU0" "$LOGS/nccl_kv_gpu_test$t.log" >>"$OUT/summary.txt"
    grep -oE "via [A-Za-z/0-9_]+" "$LOGS/nccl_kv_gpu_test$t.log" | sort | uniq -c | head -4 \
      >>"$OUT/summary.txt"
    row "nccl_kv_gpu_test${t:- (P2P)}" "$(verdict "$LOGS/nccl_kv_gpu_test$t.log")" \
      "$(grep -hE '^nccl GPU0' "$LOGS/nccl_kv_gpu_test$t.log" | sed 's/^nccl GPU0->GPU1 //' | tr '\n' ' ')"
  done
  # (2) Served, Qwen3-8B shapes.
  make_model qwen3-8b
  local mixed nccl
  mixed=$(KV=auto ENGINE="gpu_memory_utilization: 0.9" layout mixed-gpu0 "mixed:1:1:1:0")
  nccl=$(ENGINE="gpu_memory_utilization: 0.9" layout 1p1d-nccl "prefill:1:1:1:0" "decode:1:1:1:1")
  if ! short 90 "equality mixed" && serve_up mixed "$mixed"; then
    equality_run mixed
    serve_down
  fi
  short 150 "1p1d nccl" && return
  serve_up 1p1d-nccl "$nccl" || return
  equality_run 1p1d-nccl
  equality_verdict "64 prompts: 1P1D over $([ -n "$DRY" ] && echo tcp || echo nccl) = mixed" mixed 1p1d-nccl
  grep -h "KV transport" "$LOGS/serve_1p1d-nccl"/*.log | sort | uniq -c | head -4 >>"$OUT/summary.txt"
  kv_load p2p_2k "$LEN_2K" 8
  kv_load p2p_8k "$LEN_8K" 8
  for f in cancel decode prefill; do fault_cell "$f"; done
  serve_down
  # (3) NCCL's socket transport (loopback TCP between the two GPUs' processes), layer-wise push
  # on, then off (the whole prompt's KV after its prefill: the span is the transfer alone); last
  # P2P with the push off, the served transfer's own GB/s over NVLink.
  local nolw sockenv="$SOCKET_ENV NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET" l name file envs
  nolw=$(ENGINE="gpu_memory_utilization: 0.9" layout 1p1d-nccl-nolw \
    "prefill:1:1:1:0:--no-kv-layerwise-push" "decode:1:1:1:1")
  for l in "socket:$nccl:$sockenv" "socket_nolw:$nolw:$sockenv" "p2p_nolw:$nolw:"; do
    IFS=: read -r name file envs <<<"$l"
    short 70 "kv $name" && break
    # shellcheck disable=SC2086
    serve_up "1p1d-$name" "$file" $envs || continue
    kv_load "${name}_2k" "$LEN_2K" 6
    kv_load "${name}_8k" "$LEN_8K" 6
    grep -ohE "via [A-Za-z/0-9_]+" "$LOGS/serve_1p1d-$name"/*.log 2>/dev/null | sort | uniq -c |
      head -4 >>"$OUT/summary.txt"
    serve_down
  done
}

# --- tp / pp: tandem bench ----------------------------------------------------------------------
# tag limit [bench flags...]: batch-1 latency and 256 x (128 in / 1024 out) throughput.
bench() {
  local tag=$1 l=$2
  shift 2
  short 40 "bench $tag" && return
  # shellcheck disable=SC2086
  timeout "$(lim "$l")" $S/bin/tandem bench --model "$m" --scenarios latency,throughput \
    --json "$LOGS/bench_$tag.json" $BENCH_SIZES "$@" >"$LOGS/bench_$tag.log" 2>&1
  local rc=$?
  local lat thr
  lat=$(grep -m1 -E '^latency' "$LOGS/bench_$tag.log" | grep -oE '[0-9.]+ ms/token = [0-9.]+ tokens/s')
  thr=$(grep -m1 -E '^throughput' "$LOGS/bench_$tag.log" | cut -c1-160)
  note "bench $tag exit=$rc: $lat | $thr"
  grep -E "captured|KV cache" "$LOGS/bench_$tag.log" | head -2 >>"$OUT/summary.txt"
  row "bench $tag" "${lat:-exit $rc}" "${thr:-}"
}
# tag [bench flags...]: op profile of batch-1 and batch-64 decode steps, every 20th eager.
profile() {
  local tag=$1
  shift
  short 40 "profile $tag" && return
  # shellcheck disable=SC2086
  TANDEM_OP_PROFILE=20 timeout "$(lim 120)" $S/bin/tandem bench --model "$m" \
    --scenarios latency,decode --latency-tokens 64 --batch-sizes 64 --contexts 1024 \
    --decode-tokens 48 $PROFILE_SIZES "$@" >"$LOGS/profile_$tag.log" 2>&1
  local rc=$? v
  v=$($PY opgap "$LOGS/profile_$tag.log")
  note "profile $tag exit=$rc: $v"
  grep -E "op profile of step" -A4 "$LOGS/profile_$tag.log" | head -12 >>"$OUT/summary.txt"
  row "op profile $tag" "exit $rc" "$v"
}
# Served equality of a parallel layout against one engine on one GPU (small-qwen3).
served_parallel() {  # tag group-spec
  local ref par
  make_model small-qwen3
  ref=$(KV=auto ENGINE="gpu_memory_utilization: 0.4, max_model_len: 2048" layout ref-tp1 "mixed:1:1:1:0")
  par=$(KV=auto ENGINE="gpu_memory_utilization: 0.4, max_model_len: 2048" layout "$1" "$2")
  # One reference per call (tp, pp and mixed use the same one).
  if [ ! -f "$LOGS/lg_eq_ref-tp1.json" ] && ! short 60 "served ref" && serve_up ref-tp1 "$ref"; then
    equality_run ref-tp1
    serve_down
  fi
  if ! short 60 "served $1" && serve_up "$1" "$par"; then
    equality_run "$1"
    scrape "$LOGS/m_$1.txt"
    local p
    p=$($PY pages "$LOGS/m_$1.txt")
    serve_down
    equality_verdict "64 prompts: $1 = TP 1 ($p)" ref-tp1 "$1" "${3:-}"
  fi
}

tp() {
  local TESTS=${TP_TESTS:-"nccl_communicator_gpu_test engine_cuda_tp_test"}
  run_named_tests "$(lim 200)"
  grep -hE "all-reduce|us$" "$LOGS/nccl_communicator_gpu_test.log" 2>/dev/null | head -4 >>"$OUT/summary.txt"
  for t in $TESTS; do
    row "${t%%:*}" "$(verdict "$LOGS/${t%%:*}.log")" \
      "$(grep -hE 'all-reduce of' "$LOGS/${t%%:*}.log" | head -1)"
  done
  served_parallel mixed-tp2 "mixed:1:2:1:0,1" near
  make_model llama3-8b
  bench tp1 150 --tensor-parallel-size 1
  bench tp2_graphs 170 --tensor-parallel-size 2
  bench tp2_eager 170 --tensor-parallel-size 2 --enforce-eager
  profile tp1 --tensor-parallel-size 1
  profile tp2 --tensor-parallel-size 2
}

pp() {
  local TESTS=${PP_TESTS:-"engine_cuda_pp_test"}
  run_named_tests "$(lim 200)"
  row "engine_cuda_pp_test" "$(verdict "$LOGS/engine_cuda_pp_test.log")" ""
  served_parallel mixed-pp2 "mixed:1:1:2:0,1"
  make_model llama3-8b
  bench pp1 150 --pipeline-parallel-size 1
  bench pp2_mb2 170 --pipeline-parallel-size 2
  bench pp2_mb1 170 --pipeline-parallel-size 2 --pipeline-micro-batches 1
}

# --- mixed sizes --------------------------------------------------------------------------------
mixed_sizes() {
  local spec_p spec_d what ref par
  if [ "$NGPU" -ge 4 ]; then
    spec_p="prefill:1:2:1:0,1" spec_d="decode:1:1:1:2" what="prefill TP 2 -> decode TP 1"
  else
    spec_p="prefill:1:1:1:0" spec_d="decode:1:2:1:0,1" what="prefill TP 1 -> decode TP 2"
  fi
  make_model small-qwen3
  ref=$(KV=auto ENGINE="gpu_memory_utilization: 0.4, max_model_len: 2048" layout ref-tp1 "mixed:1:1:1:0")
  # GPU 0 holds two processes on x2 (the prefill worker and decode rank 0): 0.4 of it each.
  par=$(KV=auto ENGINE="gpu_memory_utilization: 0.4, max_model_len: 2048" layout mixed-sizes \
    "$spec_p" "$spec_d")
  if [ ! -f "$LOGS/lg_eq_ref-tp1.json" ] && ! short 60 "served ref" && serve_up ref-tp1 "$ref"; then
    equality_run ref-tp1
    serve_down
  fi
  short 60 "served mixed sizes" && return
  serve_up mixed-sizes "$par" || return
  equality_run mixed-sizes
  sleep 2
  scrape "$LOGS/m_mixed_sizes.txt"
  local p
  p=$($PY pages "$LOGS/m_mixed_sizes.txt")
  grep -h "KV transport" "$LOGS/serve_mixed-sizes"/*.log | sort | uniq -c | head -4 >>"$OUT/summary.txt"
  serve_down
  equality_verdict "64 prompts: $what = TP 1 mixed ($p)" ref-tp1 mixed-sizes near
}

# --- disagg: gpu_run_engine.sh's sweep with the two-GPU layouts ---------------------------------
disagg() {
  local one two
  one=$(ENGINE="gpu_memory_utilization: 0.9" layout 1p1d-nccl "prefill:1:1:1:0" "decode:1:1:1:1")
  two=$(KV=auto ENGINE="gpu_memory_utilization: 0.9" layout mixed-x2 "mixed:2:1:1:0,1")
  local wl=${SWEEP_WORKLOADS:-prefill:2048:128:64:4,8,16,24,32 decode:128:1024:160:5,10,20,40}
  local presets=qwen3-8b
  if [ -n "$DRY" ]; then
    wl=${SWEEP_WORKLOADS:-prefill:256:8:12:4,8 decode:16:32:12:4,8}
    presets=tiny
  fi
  OUT=$OUT/disagg MODELS=$MODELS PRESETS=$presets TANDEM_STAGE=$S SWEEP_PORT=$PORT \
    SWEEP_LAYOUTS="mixed-x2=$two 1p1d-nccl=$one" SWEEP_WORKLOADS="$wl" \
    SWEEP_DEADLINE_S=$((DEADLINE - SECONDS - 15)) \
    timeout "$(lim 600 5)" engine/bench/gpu_run_engine.sh sweep >"$LOGS/disagg_sweep.log" 2>&1
  note "gpu_run_engine.sh sweep exit=$?"
  mv "$OUT"/disagg/sweep_*.html "$OUT/" 2>/dev/null
  cat "$OUT"/disagg/sweep_summary_*.txt >>"$OUT/summary.txt" 2>/dev/null
  row "disagg sweep" "$(ls "$OUT"/sweep_*.html 2>/dev/null | wc -l) reports" \
    "$(grep -hiE 'best goodput' "$OUT"/disagg/sweep_summary_*.txt 2>/dev/null | tr '\n' ' ' | cut -c1-400)"
}

SOCKET_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1"
if [ -n "$DRY" ]; then
  LEN_2K=256 LEN_8K=768 FAULT_LEN=768 FAULT_PROMPTS=400 FAULT_AT_S=1 CANCEL_S=0.05
  BENCH_SIZES="--latency-tokens 16 --num-prompts 8 --input-len 32 --output-len 16"
  PROFILE_SIZES=""
else
  # 24 prompts of 8000 tokens at 3 in flight: ~24 back-to-back prefill steps of ~0.2 s, each
  # one chunk whose layer-wise push spans it; the kill lands at 3 s, mid-load.
  LEN_2K=2048 LEN_8K=8000 FAULT_LEN=8000 FAULT_PROMPTS=24 FAULT_AT_S=3 CANCEL_S=0.15
  BENCH_SIZES="" PROFILE_SIZES=""
fi
for mode in "$@"; do
  note "== $mode"
  case "$mode" in
    kv) kv ;;
    tp) tp ;;
    pp) pp ;;
    disagg) disagg ;;
    mixed) mixed_sizes ;;
    tests) run_named_tests "$(lim 540)" ;;
  esac
  serve_down
done
serve_down
# Everything but the summary and the reports in one archive (a call brings back 8 files).
{
  echo
  echo "| step | result | figures |"
  echo "| --- | --- | --- |"
  cat "$OUT/table.txt"
} >>"$OUT/summary.txt"
rm -f "$OUT/table.txt"
(cd "$OUT" && tar -czf "logs_$tag.tgz" --exclude="logs_*.tgz" --exclude=summary.txt \
  --exclude="sweep_*.html" -- * 2>/dev/null)
find "$OUT" -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name "logs_*.tgz" ! -name "sweep_*.html" \
  -exec rm -rf {} +
echo "===== summary"
cat "$OUT/summary.txt"
