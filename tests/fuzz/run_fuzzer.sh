#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time, in a scratch copy of its committed corpus (the
# committed one is never modified): first every committed input (regressions), then mutations
# for SECONDS. Fails on a crash, a sanitizer report, a leak or an input slower than 10 s; the
# input that failed is kept next to the scratch corpus and named in the output.
#   tests/fuzz/run_fuzzer.sh FUZZER CORPUS_DIR SECONDS
set -euo pipefail
fuzzer=$1 seconds=$3
corpus=$(cd "$2" && pwd)
if [ ! -x "$fuzzer" ]; then
  echo "run_fuzzer: $fuzzer was not built (no libFuzzer in this clang?)" >&2
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-fuzz.XXXXXX")
trap 'rm -rf "$work/corpus"' EXIT
mkdir -p "$work/corpus"
cp -r "$corpus"/. "$work/corpus/"
cd "$work"
echo "run_fuzzer: $(basename "$fuzzer") for ${seconds}s on $(ls "$corpus" | wc -l) committed inputs"
if ! "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
     -print_final_stats=1 -artifact_prefix="$work/" corpus 2>"$work/log"; then
  tail -60 "$work/log" >&2
  echo "run_fuzzer: FAILED; the input is in $work (crash-*, leak-*, timeout-*)" >&2
  exit 1
fi
grep -E "^stat::(number_of_executed_units|new_units_added)|INFO: seed corpus" "$work/log" || true
rm -rf "$work"
