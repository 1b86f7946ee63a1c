# Shared by the session run scripts of this folder (sourced, after S, OUT and LOGS are set):
#   note MESSAGE...          a timestamped line on stdout and in $OUT/summary.txt
#   run_test NAME LIMIT ARGS  $S/tests/NAME under `timeout LIMIT`, its log in $LOGS (suffix $TAG),
#                            its gtest verdict and first failures in the summary
note() { echo "[${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
run_test() {
  local t=$1 limit=$2
  shift 2
  timeout "$limit" "$S/tests/$t" "$@" >"$LOGS/$t${TAG:-}.log" 2>&1
  note "$t${TAG:-} exit=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' \
    "$LOGS/$t${TAG:-}.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure$" -A3 "$LOGS/$t${TAG:-}.log" | head -24 >>"$OUT/summary.txt"
}
