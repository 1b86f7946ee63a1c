#!/usr/bin/env bash
# Product code reads time and waits for it only through a Clock (base/clock.h): lists every direct
# absl::Now(), absl::SleepFor(), timed absl::Mutex / CondVar wait, std::chrono clock read or
# std::this_thread sleep and fails if there is one. Real time, where it is the point, is
# Clock::Real() by name. Not checked: base/clock.* (the real clock itself), base/logging.cc (log
# lines carry the wall-clock time), loadgen/ (its own monotonic BenchClock, loadgen/bench_clock.h)
# and tests/.
#   tests/base/check_clock_calls.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
pattern='absl::Now\(\)|absl::SleepFor\(|(Await|LockWhen|ReaderLockWhen|WriterLockWhen)With(Timeout|Deadline)\(absl::Condition|WaitWith(Timeout|Deadline)\(|(steady|system|high_resolution)_clock::now|this_thread::sleep_'
mapfile -t dirs < <(find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -name tests ! -name loadgen \
                      ! -name 'build*' ! -name out -printf '%P\n' | sort)
hits=$(grep -rnE "$pattern" --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
         "${dirs[@]}" | grep -vE '^base/(clock\.(h|cc)|logging\.cc):' || true)
if [ -n "$hits" ]; then
  echo "Read time through a Clock (base/clock.h), Clock::Real() where real time is meant:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "clock calls: none outside base/clock.cc in ${#dirs[@]} folders"
