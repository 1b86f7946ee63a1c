#!/usr/bin/env bash
# Copies into OUTDIR every shared library that the given binaries load, except the ones the GPU
# machine brings itself, so that binaries built on this Debian machine run there unchanged:
#
#   tools/gpu/bundle-libs.sh OUTDIR BINARY...
#   (there:  source tools/gpu/gpu-env.sh --libs OUTDIR)
#
# Left out: the C and C++ runtimes and the loader (the GPU machine's are newer and backward
# compatible), the CUDA driver and toolkit libraries, cuBLAS and NCCL (large, and installed there
# in the version nvcc here targets). Arguments that are not ELF files (scripts, directories) are
# skipped, so `OUTDIR STAGE/*` works. Fails, naming them, if a library cannot be found here.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUTDIR BINARY..." >&2
  exit 2
fi
out=$1
shift

# Library file names (as ldd resolves them) that stay behind.
system_libs='^(ld-linux.*|lib(c|m|dl|rt|pthread|util|resolv|gcc_s|stdc\+\+|atomic))\.so'
gpu_libs='^lib(cuda|cudart|cublas|cublasLt|nccl|nv[A-Za-z0-9_-]*)\.so'

elf_binaries=()
for b in "$@"; do
  [ -f "$b" ] && [ "$(head -c 4 "$b" | od -An -c | tr -d ' ')" = '177ELF' ] && elf_binaries+=("$b")
done
if [ ${#elf_binaries[@]} -eq 0 ]; then
  echo "$0: no ELF binary among the arguments" >&2
  exit 2
fi

# ldd prints the whole closure: "libfoo.so.1 => /path/libfoo.so.1 (0x...)" or "=> not found".
listing=$(for b in "${elf_binaries[@]}"; do ldd "$b"; done)
missing=$(awk '/=> not found/ {print $1}' <<<"$listing" | sort -u)
if [ -n "$missing" ]; then
  echo "$0: libraries not found here: $(tr '\n' ' ' <<<"$missing")" >&2
  exit 1
fi
mkdir -p "$out"
n=0
while read -r path; do
  name=$(basename "$path")
  if [[ "$name" =~ $system_libs || "$name" =~ $gpu_libs ]]; then continue; fi
  cp -L --update "$path" "$out/$name"  # -L: the file itself, under the name the loader asks for
  n=$((n + 1))
done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$listing" | sort -u)
size=$(du -sh "$out" | cut -f1)
echo "bundle-libs: $n libraries for ${#elf_binaries[@]} binaries, $size in $out"
