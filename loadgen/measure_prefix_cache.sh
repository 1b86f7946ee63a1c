#!/usr/bin/env bash
# Measures automatic prefix caching and KV-aware routing with tandem-loadgen's multi-turn chat
# workload (--dataset-name multi-turn): the same layout is served once per run, each run a
# variant of it, and the same requests are sent to each.
#   loadgen/measure_prefix_cache.sh BUILD_DIR LAYOUT [MODEL_DIR] [RESULT_DIR]
# A run is CACHE-POLICY: CACHE on | off (engine.enable_prefix_caching), POLICY least-loaded |
# round-robin | kv-aware (router.routing_policy). LAYOUT must have `router:` and `engine:`
# blocks (deploy/layouts/2p2d.yaml does); MODEL_DIR empty: the layout's model (the generated tiny
# model on CPU). Per run RESULT_DIR gets the loadgen's result JSON and output, the layout served,
# the serve log and every worker's prefix-cache and KV-transfer metrics.
# Environment (defaults in brackets): RUNS ["on-least-loaded off-least-loaded on-kv-aware"],
# NUM_PROMPTS [64], TURNS [4], SYSTEM_LEN [512], SYSTEM_PROMPTS [2], USER_LEN [64],
# OUTPUT_LEN [16], CONCURRENCY [4], RATE [inf], READY_S [300], REQUEST_TIMEOUT_S [600].
set -euo pipefail
build=${1:?build dir}
layout=${2:?layout yaml}
model=${3:-}
out=${4:-results/prefix-cache}
runs=${RUNS:-"on-least-loaded off-least-loaded on-kv-aware"}
mkdir -p "$out"
tokenizer=${model:-$HOME/.cache/tandem/models/tiny}

for run in $runs; do
  cache=${run%%-*}
  policy=${run#*-}
  [[ $cache == on ]] && enable=true || enable=false
  served="$out/layout-$run.yaml"
  # The layout with its own enable_prefix_caching / routing_policy lines replaced by the run's.
  awk -v enable="$enable" -v policy="$policy" '
    /^[[:space:]]+(enable_prefix_caching|routing_policy):/ { next }
    { print }
    /^engine:/ { print "  enable_prefix_caching: " enable }
    /^router:/ { print "  routing_policy: " policy }' "$layout" >"$served"
  port=$((20000 + RANDOM % 20000))
  "$build/bin/tandem" serve --layout "$served" ${model:+--model "$model"} --port "$port" \
    >"$out/serve-$run.log" 2>&1 &
  serve=$!
  ready=0
  for _ in $(seq 1 "${READY_S:-300}"); do
    if grep -q "Ctrl-C" "$out/serve-$run.log" 2>/dev/null; then ready=1; break; fi
    if ! kill -0 "$serve" 2>/dev/null; then break; fi
    sleep 1
  done
  if [[ $ready != 1 ]]; then
    echo "$run: tandem serve did not come up; see $out/serve-$run.log" >&2
    kill -INT "$serve" 2>/dev/null || true
    wait "$serve" || true
    exit 1
  fi
  "$build/bin/tandem-loadgen" --port "$port" --dataset-name multi-turn \
    --num-prompts "${NUM_PROMPTS:-64}" --multi-turn-turns "${TURNS:-4}" \
    --multi-turn-system-len "${SYSTEM_LEN:-512}" \
    --multi-turn-system-prompts "${SYSTEM_PROMPTS:-2}" \
    --random-input-len "${USER_LEN:-64}" --random-output-len "${OUTPUT_LEN:-16}" \
    --max-concurrency "${CONCURRENCY:-4}" --request-rate "${RATE:-inf}" \
    --tokenizer "$tokenizer" --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,99 \
    --save-result --result-dir "$out" --result-filename "$run.json" --label "$run" \
    --request-timeout "${REQUEST_TIMEOUT_S:-600}" --disable-progress >"$out/loadgen-$run.txt" 2>&1 ||
    echo "$run: tandem-loadgen exited with $? (failed requests?)" >&2
  # Every worker's prefix-cache and transfer counters, from the metrics URLs serve printed.
  : >"$out/metrics-$run.txt"
  grep -oE 'http://[0-9.]+:[0-9]+/metrics +\((prefill|decode|mixed)-[0-9]+' \
    "$out/serve-$run.log" | while read -r url name; do
    echo "# ${name#(}" >>"$out/metrics-$run.txt"
    curl -s "$url" | grep -E '^tandem(:prefix_cache|_worker_prefix_cache|_worker_kv_pages_cached|_worker_kv_(send|receive)_seconds_(sum|count)|_worker_prefill_time_seconds_(sum|count))' \
      >>"$out/metrics-$run.txt" || true
  done
  kill -INT "$serve"
  wait "$serve" || true
  echo "== $run"
  grep -E "Successful requests|Failed requests|Mean TTFT|Median TTFT|P99 TTFT|Mean E2EL|Mean prefill|Mean kv_transfer" \
    "$out/loadgen-$run.txt" || cat "$out/loadgen-$run.txt"
  grep -E "prefix_cache_(hits|queries)_total" "$out/metrics-$run.txt" | sed 's/^/  /' || true
done

# The runs side by side (the README's table), from each run's result JSON and worker metrics.
python3 - "$out" $runs <<'PY'
import json, re, sys
out, runs = sys.argv[1], sys.argv[2:]
print("| run | requests ok / failed | TTFT mean / median / P99 (ms) | prefill mean (ms) "
      "| KV transfer mean (ms) | prefix-cache hits |")
print("| --- | --- | --- | --- | --- | --- |")
for run in runs:
    try:
        r = json.load(open(f"{out}/{run}.json"))
    except (OSError, ValueError):
        print(f"| {run} | no result | | | | |")
        continue
    total = {"hits": 0.0, "queries": 0.0}
    try:
        for line in open(f"{out}/metrics-{run}.txt"):
            m = re.match(r"tandem:prefix_cache_(hits|queries)_total(\{[^}]*\})? (\S+)", line)
            if m:
                total[m.group(1)] += float(m.group(3))
    except OSError:
        pass
    hits, queries = total["hits"], total["queries"]
    rate = f"{100 * hits / queries:.1f}% ({hits:.0f} of {queries:.0f} tokens)" if queries else "0"
    causes = ", ".join(f"{k} {v}" for k, v in (r.get("failed_by_cause") or {}).items() if v)
    t = r.get("server_timing", {})
    print(f"| {run} | {r['completed']} / {r['failed']}{' (' + causes + ')' if causes else ''} "
          f"| {r['mean_ttft_ms']:.0f} / {r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} "
          f"| {t.get('mean_prefill_ms', 0):.1f} | {t.get('mean_kv_transfer_ms', 0):.1f} | {rate} |")
PY
