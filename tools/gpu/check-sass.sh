#!/usr/bin/env bash
# Scans the device code of binaries for instruction encodings known to fault on an H200:
# global-memory instructions whose 64-bit memory descriptor sits in an odd-numbered uniform
# register pair (`desc[UR1]`, ...). ptxas of CUDA 13.0 emitted those for cp.async copies carrying
# an L2 cache-policy operand with a uniform shared-memory offset (`LDGSTS [R+UR]`), and every one
# raised cudaErrorIllegalInstruction (kernels/paged_attention/WORKLOG.md step 14).
# Needs cuobjdump (the GPU machine has it; the development image does not).
# Usage: tools/gpu/check-sass.sh BINARY...   (exit 1 and the offending lines when any is found)
set -uo pipefail
command -v cuobjdump >/dev/null || { echo "check-sass: cuobjdump not found" >&2; exit 2; }
bad=0
for f in "$@"; do
  hits=$(cuobjdump -sass "$f" 2>/dev/null | grep -E "Function :|desc\[UR[0-9]*[13579]\]" |
    grep -B1 -E "desc\[UR[0-9]*[13579]\]" | grep -vE "^--$")
  if [ -n "$hits" ]; then
    echo "check-sass: $f: odd uniform descriptor registers:"
    echo "$hits" | head -20
    bad=1
  else
    echo "check-sass: $f: clean"
  fi
done
exit $bad
