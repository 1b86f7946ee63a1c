# The environment for building or running tandem on the GPU machine. Source it (bash), from any
# directory:
#
#   source tools/gpu/gpu-env.sh [--libs DIR]... [--debs DIR]... [--info]
#
#   --libs DIR  a folder of shared libraries made by tools/gpu/bundle-libs.sh: put first on
#               LD_LIBRARY_PATH, so binaries built on the development machine run here (a
#               missing DIR is skipped with a warning).
#   --debs DIR  a folder of .deb files fetched by tools/gpu/fetch-debs.sh: unpacked (once) into a
#               private prefix, $TANDEM_DEB_PREFIX or DIR/root, and the compiler, CMake,
#               pkg-config and the loader pointed at it, so tandem builds here. The machine's own
#               system libraries are left as they are.
#   --info      print the GPUs, nvcc, cmake and the core count.
#
# Always: CUDA (CUDA_HOME, default /usr/local/cuda) on PATH and LD_LIBRARY_PATH, and NVLink
# multicast (NVLS) off for NCCL, PyTorch and NVSHMEM: the host's GPUs may be shared with other
# jobs, so nothing of ours turns it on. Safe to source more than once.

# Unpacks the .deb files of $1 into $2 unless that was done since the newest of them arrived, and
# points Debian's pkg-config files (which name /usr) at $2. CMake package files locate themselves.
_tandem_unpack_debs() {
  local dir=$1 root=$2 deb
  if [ -f "$root/.unpacked" ] &&
    [ -z "$(find "$dir" -maxdepth 1 -name '*.deb' -newer "$root/.unpacked")" ]; then
    return 0
  fi
  mkdir -p "$root"
  for deb in "$dir"/*.deb; do dpkg-deb -x "$deb" "$root" || return 1; done
  find "$root/usr/lib/x86_64-linux-gnu/pkgconfig" "$root/usr/share/pkgconfig" -name '*.pc' \
    -exec sed -i -E -e "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=$root/usr#" \
    -e "s#-I/usr/include#-I$root/usr/include#g" {} + 2>/dev/null
  touch "$root/.unpacked"
}

_tandem_gpu_env() {
  # First, so that it holds even if an argument below is refused.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local libs=() debs=() info=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --libs)
        [ $# -ge 2 ] || { echo "gpu-env.sh: --libs needs a directory" >&2; return 2; }
        # A stage without a bundle (built on this machine) is fine: warn and go on.
        if [ -d "$2" ]; then
          libs+=("$(cd "$2" && pwd)")
        else
          echo "gpu-env.sh: no $2, skipped" >&2
        fi
        shift 2
        ;;
      --debs)
        if [ $# -lt 2 ] || ! ls "$2"/*.deb >/dev/null 2>&1; then
          echo "gpu-env.sh: --debs needs a directory of .deb files" >&2
          return 2
        fi
        debs+=("$(cd "$2" && pwd)")
        shift 2
        ;;
      --info) info=1; shift ;;
      *) echo "gpu-env.sh: unknown argument '$1'" >&2; return 2 ;;
    esac
  done

  local cuda=${CUDA_HOME:-/usr/local/cuda}
  local ld="$cuda/lib64:/usr/lib/x86_64-linux-gnu"
  export PATH="$cuda/bin:$PATH"
  local dir root lib
  for dir in "${debs[@]}"; do
    root=${TANDEM_DEB_PREFIX:-$dir/root}
    if ! _tandem_unpack_debs "$dir" "$root"; then
      echo "gpu-env.sh: unpacking $dir failed" >&2
      return 1
    fi
    lib=$root/usr/lib/x86_64-linux-gnu
    ld="$lib:$root/usr/lib:$ld"
    export PATH="$root/usr/bin:$PATH"
    export CMAKE_PREFIX_PATH="$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    PKG_CONFIG_PATH="$lib/pkgconfig:$root/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_PATH
    export CPATH="$root/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  done
  for dir in "${libs[@]}"; do ld="$dir:$ld"; done
  export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  if [ "$info" = 1 ]; then
    nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader \
      2>/dev/null | sed 's/^/gpu: /'
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1) | cores: $(nproc)"
  fi
}

_tandem_gpu_env "$@"
_tandem_gpu_env_rc=$?
unset -f _tandem_gpu_env _tandem_unpack_debs
# `return` when sourced; `exit` if someone runs it as a script.
# shellcheck disable=SC2317
return "$_tandem_gpu_env_rc" 2>/dev/null || exit "$_tandem_gpu_env_rc"
