#!/usr/bin/env bash
# Stages the binaries of the session run scripts (engine/bench/runs/gpu_run_s2*.sh) and of the
# sweep (engine/bench/gpu_run_engine.sh sweep): engine/bench/stage_engine.sh's layout
# (.gpu-eng/{bin,tests,_libs}) with only what those calls run, packed as $PACK/eng.tar.xz
# (default .gpu-pack) so that it fits the 64 MiB a call carries beside the working tree.
# Usage: [PACK=.gpu-pack24] [BINS=".." | EXTRA_BINS="kb_bench"] [TEST_BINS=".." | EXTRA_TESTS="a_test"]
#        [NO_BUILD=1] engine/bench/runs/stage_pack.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/../../.."
dir=${1:-build}
stage=.gpu-eng
# BINS / TEST_BINS replace the default lists (a call that needs fewer binaries carries less).
bins=(${BINS:-tandem tandem-router tandem-decode-worker tandem-prefill-worker tandem-loadgen
  attention_bench} ${EXTRA_BINS:-})
tests=(${TEST_BINS:-attention_gpu_test engine_cuda_test disagg_equality_gpu_test} ${EXTRA_TESTS:-})
# NO_BUILD=1: stage what the build directory holds (another build may be running in it).
[ -n "${NO_BUILD:-}" ] || cmake --build "$dir" --target "${bins[@]}" "${tests[@]}" -j"$(nproc)"
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/tests"
for b in "${bins[@]}"; do cp "$dir/bin/$b" "$stage/bin/"; done
for t in "${tests[@]}"; do cp "$dir/tests/$t" "$stage/tests/"; done
strip "$stage"/bin/* "$stage"/tests/*
tools/gpu/bundle-libs.sh "$stage/_libs" "$stage"/bin/* "$stage"/tests/* >/dev/null
pack=${PACK:-.gpu-pack}
mkdir -p "$pack"
tar -cf - "$stage" | xz -T2 -6 >"$pack/eng.tar.xz"
du -sh "$stage" "$pack/eng.tar.xz"
