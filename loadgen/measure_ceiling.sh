#!/usr/bin/env bash
# Measures the loadgen's own ceiling: one tandem-loadgen process against the trivial fake server
# (tandem-loadgen-fake-server, also one process) on this machine. For each offered rate it
# prints what the loadgen achieved, its CPU use, its send lag (how late it released requests)
# and how far the measured TTFT / ITL are from the scripted ones. The loadgen is the limit when
# achieved < offered, the send lag grows, or the measured ITL drifts from the script.
#   loadgen/measure_ceiling.sh BUILD_DIR [RATES] [OUTPUT_TOKENS] [SECONDS]
# On a machine shared with other work, the kernel splits CPU between sessions (autogroups), so
# plain `nice` does not help; run it as `AUTOGROUP_NICE=-20 setsid loadgen/measure_ceiling.sh
# ...` (root) to give this session's autogroup the cores for the measurement: the point is the
# loadgen's capacity, not the contention.
set -euo pipefail
if [[ -n "${AUTOGROUP_NICE:-}" ]]; then echo "$AUTOGROUP_NICE" >/proc/self/autogroup; fi
build=${1:?build dir}
rates=${2:-"500 1000 2000 3000"}
tokens=${3:-50}
seconds=${4:-10}
ttft_ms=1
itl_ms=0.5
port=$((20000 + RANDOM % 20000))
"$build/bin/tandem-loadgen-fake-server" --port "$port" --ttft-ms "$ttft_ms" --itl-ms "$itl_ms" \
  >/dev/null &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
sleep 0.5
printf "%8s %10s %10s %8s %10s %10s %10s %10s\n" offered "req/s" "tok/s" "cpu%" \
  "lag_mean" "lag_max" "ttft_p50" "itl_mean"
for rate in $rates; do
  n=$(awk -v r="$rate" -v s="$seconds" 'BEGIN { print int(r * s) }')
  out=$(mktemp)
  /usr/bin/time -f "%P" -o "$out.time" "$build/bin/tandem-loadgen" \
    --base-url "http://127.0.0.1:$port" --model fake --num-prompts "$n" --request-rate "$rate" \
    --random-input-len 16 --random-output-len "$tokens" --percentile-metrics ttft,itl \
    --metric-percentiles 50 --disable-progress >"$out"
  get() { grep -m1 "$1" "$out" | awk '{print $NF}'; }
  printf "%8s %10s %10s %8s %10s %10s %10s %10s\n" "$rate" "$(get 'Request throughput')" \
    "$(get 'Output token throughput')" "$(tr -d '%' <"$out.time")" "$(get 'Mean send lag')" \
    "$(get 'Max send lag')" "$(get 'P50 TTFT')" "$(get 'Mean ITL')"
  rm -f "$out" "$out.time"
done
echo "(scripted: TTFT ${ttft_ms} ms, ITL ${itl_ms} ms, ${tokens} tokens per request)"
