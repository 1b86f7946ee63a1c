# Shared by the session run scripts of this folder (sourced, after S, OUT, LOGS and MODELS are
# set):
#   note MESSAGE...          a timestamped line on stdout and in $OUT/summary.txt
#   run_test NAME LIMIT ARGS  $S/tests/NAME under `timeout LIMIT`, its log in $LOGS (suffix $TAG),
#                            its gtest verdict and first failures in the summary
#   run_named_tests LIMIT    run_test on each of $TESTS ("bin" or "bin:gtest filter")
#   bench_tp TAG [ENV=V...]  `tandem bench` throughput on $m with FP8 weights ($BENCH_KV_ARGS)
#   ncu_decode TAG B L PAGE KV PATTERN [SECTIONS...]  ncu of one `attention_bench one` decode
#                            launch (environment $NCU_ENV), the PATTERN lines in the summary
#   make_llama               a random Llama-3-8B-shaped checkpoint in $MODELS/llama3-8b (sets m)
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
run_test() {
  local t=$1 limit=$2
  shift 2
  timeout "$limit" "$S/tests/$t" "$@" >"$LOGS/$t${TAG:-}.log" 2>&1
  note "$t${TAG:-} exit=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' \
    "$LOGS/$t${TAG:-}.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure$" -A3 "$LOGS/$t${TAG:-}.log" | head -24 >>"$OUT/summary.txt"
}
run_named_tests() {
  for spec in ${TESTS:-}; do
    if [[ $spec == *:* ]]; then
      run_test "${spec%%:*}" "$1" --gtest_filter="${spec#*:}"
    else
      run_test "$spec" "$1"
    fi
  done
}
bench_tp() {
  local tag=$1
  shift
  env "$@" timeout 150 $S/bin/tandem bench --model "$m" --quantization fp8 \
    --scenarios throughput --json "$LOGS/bench_$tag.json" ${BENCH_KV_ARGS:-} \
    >"$LOGS/bench_$tag.log" 2>&1
  note "bench $tag exit=$?: $(grep -E '^throughput' "$LOGS/bench_$tag.log" | head -2 | tr '\n' ' ')"
  grep -E "KV cache|captured" "$LOGS/bench_$tag.log" | head -2 >>"$OUT/summary.txt"
}
ncu_decode() {
  local tag=$1 b=$2 l=$3 page=$4 kv=$5 pattern=$6
  shift 6
  local sections=()
  for s in "$@"; do sections+=(--section "$s"); done
  # shellcheck disable=SC2086
  env ${NCU_ENV:-} timeout 120 ncu --clock-control none -k regex:DecodeKernel \
    --launch-skip 20 --launch-count 1 "${sections[@]}" \
    $S/bin/attention_bench one "$b" "$l" "$page" "$kv" >"$LOGS/ncu_$tag.txt" 2>&1
  note "ncu $b x $l $tag exit=$?"
  grep -E "$pattern" "$LOGS/ncu_$tag.txt" | head -16 >>"$OUT/summary.txt"
}
make_llama() {
  m=$MODELS/llama3-8b
  /usr/bin/time -f "make-model llama3-8b: %e s" $S/bin/tandem make-model --preset llama3-8b \
    --out "$m" >"$LOGS/make_model.log" 2>&1
  note "$(tail -1 "$LOGS/make_model.log")"
}
