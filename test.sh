#!/usr/bin/env bash
# The test command: installs dependencies, builds tandem (CUDA kernels too when nvcc is present),
# checks formatting and runs the whole test suite. GPU tests skip cleanly without a GPU.
#   ./test.sh            (BUILD_DIR=build by default)
set -euo pipefail
cd "$(dirname "$0")"
./deploy/install-deps.sh --with-python
export PATH="$PWD/.venv/bin:$PATH"
BUILD_DIR=${BUILD_DIR:-build}
./deploy/check-format.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_WERROR=ON >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
cd "$BUILD_DIR"
ctest --output-on-failure -j"$(nproc)"
