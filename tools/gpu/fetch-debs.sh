#!/usr/bin/env bash
# Downloads, on this (Debian 12) machine, the Debian packages tandem builds against and every
# library they pull in, into DEST, so that tandem can be built on a GPU machine that reaches no
# package archive:
#
#   tools/gpu/fetch-debs.sh DEST            # the libraries of deploy/packages.txt
#   tools/gpu/fetch-debs.sh DEST PKG...     # these packages instead
#   (there:  source tools/gpu/gpu-env.sh --debs DEST)
#
# Without PKG arguments it takes deploy/packages.txt minus the build tools the GPU machine has
# its own of (compiler, CMake, Ninja, ccache, clang-format, Python). Whatever the list, packages
# of the base system are never downloaded: the GPU machine's C runtime, compiler, core libraries
# and package tools stay in charge (it unpacks the rest into a private prefix, gpu-env.sh).
# Needs apt-get and apt-cache, no root. About 40 MB for the default list.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DEST [PKG...]" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=$1
shift

# Build tools the GPU machine brings (not libraries tandem links).
gpu_machine_tools='^(cmake|ninja-build|g\+\+|ccache|clang-format|python3|python3-venv)$'
if [ $# -gt 0 ]; then
  wanted=("$@")
else
  mapfile -t wanted < <(grep -vE '^\s*(#|$)' "$repo/deploy/packages.txt" |
    grep -vE "$gpu_machine_tools")
fi

# The base system: never shipped, whatever depends on it.
base_system=(
  'libc6' 'libc6-dev' 'libc-bin' 'libc-dev-bin' 'linux-libc-dev' 'libcrypt1' 'libcrypt-dev'
  'libnsl.*' 'libtirpc.*' 'rpcsvc-proto'
  'gcc.*' 'g\+\+.*' 'cpp.*' 'lib(gcc|stdc\+\+)-[0-9]+-dev' 'libgcc-s1' 'libstdc\+\+6'
  'lib(gomp|atomic|quadmath|itm|cc1-)[0-9]*' 'lib(a|ub|l|t|hwa)san[0-9]*'
  'binutils.*' 'libbinutils' 'libctf.*' 'libgprofng.*' 'libjansson4' 'libisl[0-9]+'
  'libmpc[0-9]+' 'libmpfr[0-9]+' 'libgmp[0-9]+'
  'zlib1g' 'libzstd1' 'liblzma5' 'libbz2-1.0' 'libselinux1' 'libpcre2-8-0'
  'perl.*' 'libperl.*' 'python3.*' 'libpython3.*' 'mime-support' 'media-types'
  'debconf' 'dpkg' 'tar' 'coreutils' 'readline-common' 'libreadline[0-9]+'
  'libncursesw[0-9]+' 'libtinfo[0-9]+' 'libsqlite3-0' 'libffi[0-9]+' 'libexpat1' 'libuuid1'
  'libdb5.3'
)
base_re="^($(IFS='|'; echo "${base_system[*]}"))\$"

# The dependency closure (no recommends/suggests); virtual packages print as <name> and are
# dropped, so are other architectures' names (name:arch).
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${wanted[@]}" | grep -E '^[a-z0-9][^:]*$' | sort -u |
  grep -vE "$base_re")
mkdir -p "$dest"
cd "$dest"
if ! apt-get download "${closure[@]}" >/dev/null 2>&1; then
  # One package without a download candidate fails the batch: take them one by one.
  failed=()
  for p in "${closure[@]}"; do apt-get download "$p" >/dev/null 2>&1 || failed+=("$p"); done
  [ ${#failed[@]} -eq 0 ] || echo "fetch-debs: no download for: ${failed[*]}" >&2
fi
n=$(find . -maxdepth 1 -name "*.deb" | wc -l)
echo "fetch-debs: $n packages, $(du -sh . | cut -f1) in $dest"
