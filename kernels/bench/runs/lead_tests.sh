# Sourced by the lead run scripts (gpu_run_lead_s9.sh, gpu_run_lead_s11.sh): their set-up (S, the
# stage directory, default .gpu-lead; its libraries on LD_LIBRARY_PATH; NVLink multicast off;
# OUT created; the GPU's name and clocks printed), and lead_tests BIN, which runs the test binary
# $S/BIN (its log in $OUT/BIN.log) and, unless SAN=0, compute-sanitizer memcheck and racecheck on
# SamplingCudaTest.SmallBatchAllPaths ($OUT/sanitizer.log); BIN "none" skips.
S=${STAGE:-.gpu-lead}
source tools/gpu/gpu-env.sh --libs "$PWD/$S/_libs"  # NVLink multicast off, CUDA paths
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

lead_tests() {
  local tb=$1
  [ "$tb" = none ] && return
  timeout 240 $S/$tb >"$OUT/$tb.log" 2>&1
  echo "[${SECONDS}s] $tb exit=$? $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/$tb.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|rounding mismatch" "$OUT/$tb.log" | head -20
  [ "${SAN:-1}" = 1 ] || return
  : >"$OUT/sanitizer.log"
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $S/$tb \
      --gtest_filter='SamplingCudaTest.SmallBatchAllPaths' >"$OUT/san.tmp" 2>&1
    echo "[${SECONDS}s] $tool exit=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/san.tmp" | sort | uniq -c | tr '\n' ' ')"
    cat "$OUT/san.tmp" >>"$OUT/sanitizer.log"
  done
  rm -f "$OUT/san.tmp"
}
