#!/usr/bin/env bash
# Builds the FlashInfer decode peer (kernels/bench/peers/, issue [decode-tc]) and tandem's
# attention_bench here (nvcc, sm_90a; no GPU needed) and stages both for the GPU machine, where
# kernels/bench/runs/gpu_run_fipeer.sh runs them in one call (carry: [".gpu-fipeer"]).
#
#   kernels/bench/runs/stage_flashinfer_peer.sh [stage dir, default .gpu-fipeer]
#
# BUILD_DIR: the build directory (default build-fipeer); an existing tandem build is reused, the
# peer's target added to it (its other targets' flags do not change). JOBS: parallel jobs (2).
#
# FlashInfer is never committed and tandem never depends on it: its headers, and the CCCL
# release it vendors (a git submodule of it, newer than the toolkit's), are exported into .peer/
# (git-ignored) from git: FLASHINFER_GIT and CCCL_GIT name local repositories (a clone or a bare
# git dir) to export from; unset, the needed commits are fetched shallowly from GitHub into
# .peer/src/. FLASHINFER_REV picks the FlashInfer commit (default: HEAD); CCCL's is the one that
# commit pins. An existing export is reused (delete .peer/ to re-export). The stage holds
# flashinfer_peer (CUDA runtime linked statically: nothing else to carry), attention_bench with
# its bundled libraries, and FLASHINFER_COMMIT.
set -euo pipefail
cd "$(dirname "$0")/../../.."
stage=${1:-.gpu-fipeer}
case "$stage" in .gpu-*) ;; *) echo "stage dir must be .gpu-* (git-ignored)" >&2; exit 2 ;; esac
peer=$PWD/.peer
build=${BUILD_DIR:-build-fipeer}  # BUILD_DIR: an existing build directory to reuse

# Prints the git dir and the commit to export: from the local repository $1 (a clone or a bare
# git dir) at $3, or, with $1 empty, fetched shallowly from URL $2 at $3 into bare repository $4.
source_rev() {
  local git=$1 url=$2 rev=$3 dir=$4
  if [ -n "$git" ]; then
    [ -d "$git/.git" ] && git=$git/.git
    echo "$git $(git --git-dir="$git" rev-parse "$rev^{commit}")"
  else
    [ -d "$dir" ] || git init --quiet --bare "$dir"
    git --git-dir="$dir" fetch --quiet --depth 1 "$url" "$rev" >&2
    echo "$dir $(git --git-dir="$dir" rev-parse "FETCH_HEAD^{commit}")"
  fi
}

# Exports paths ${@:4} of commit $2 of git dir $1 into $3 (replacing it), and the commit.
export_tree() {
  local git=$1 rev=$2 dest=$3
  shift 3
  rm -rf "$dest" && mkdir -p "$dest"
  git --git-dir="$git" archive "$rev" "$@" | tar -x -C "$dest"
  echo "$rev" >"$dest/COMMIT"
}

if [ ! -f "$peer/flashinfer/include/flashinfer/attention/decode.cuh" ]; then
  read -r fi_git rev < <(source_rev "${FLASHINFER_GIT:-}" \
    https://github.com/flashinfer-ai/flashinfer.git "${FLASHINFER_REV:-HEAD}" \
    "$peer/src/flashinfer.git")
  [ -n "${rev:-}" ] || { echo "no FlashInfer commit" >&2; exit 1; }
  export_tree "$fi_git" "$rev" "$peer/flashinfer" include LICENSE version.txt
  # The CCCL commit FlashInfer pins (its 3rdparty/cccl gitlink).
  git --git-dir="$fi_git" ls-tree "$rev" 3rdparty/cccl | awk '{print $3}' >"$peer/flashinfer/CCCL"
  rm -rf "$peer/cccl"
fi
if [ ! -d "$peer/cccl/libcudacxx/include" ]; then
  cccl_rev=$(cat "$peer/flashinfer/CCCL")
  [ -n "$cccl_rev" ] || { echo "FlashInfer names no CCCL commit" >&2; exit 1; }
  read -r cccl_git cccl_rev < <(source_rev "${CCCL_GIT:-}" https://github.com/NVIDIA/cccl.git \
    "$cccl_rev" "$peer/src/cccl.git")
  [ -n "${cccl_rev:-}" ] || { echo "no CCCL commit" >&2; exit 1; }
  export_tree "$cccl_git" "$cccl_rev" "$peer/cccl" libcudacxx/include cub/cub thrust/thrust LICENSE
fi
# FlashInfer's fp16.h includes one Boost header for a constexpr fabs; this stands in for it.
mkdir -p "$peer/shim/boost/math/ccmath"
cat >"$peer/shim/boost/math/ccmath/fabs.hpp" <<'EOF'
// Stand-in (written by tandem's stage_flashinfer_peer.sh) for the one Boost function
// FlashInfer's fp16.h uses.
#pragma once
namespace boost::math::ccmath {
template <typename T>
constexpr T fabs(T x) { return x < T(0) ? -x : x; }
}  // namespace boost::math::ccmath
EOF

# CCCL first: FlashInfer's newer CCCL must win over the toolkit's.
inc="$peer/cccl/libcudacxx/include;$peer/cccl/cub;$peer/cccl/thrust"
inc="$inc;$peer/flashinfer/include;$peer/shim"
[ -f "$build/build.ninja" ] || cmake -S . -B "$build" -G Ninja -DTANDEM_CUDA=ON -DTANDEM_WERROR=ON
cmake -B "$build" "-DTANDEM_FLASHINFER_INCLUDE=$inc" >/dev/null
cmake --build "$build" --target flashinfer_peer attention_bench -j"${JOBS:-2}"

rm -rf "$stage" && mkdir -p "$stage"
cp "$build/bin/flashinfer_peer" "$build/bin/attention_bench" "$stage/"
strip "$stage/flashinfer_peer"
echo "$(cat "$peer/flashinfer/COMMIT") version $(cat "$peer/flashinfer/version.txt" 2>/dev/null)" \
  >"$stage/FLASHINFER_COMMIT"
tools/gpu/bundle-libs.sh "$stage/_libs" "$stage/attention_bench" >/dev/null
ls -l "$stage/flashinfer_peer"
du -sh "$stage"
