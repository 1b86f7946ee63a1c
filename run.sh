#!/usr/bin/env bash
# The "run the system" command: installs dependencies, builds tandem's binaries and runs
# `tandem serve`. With no arguments on a machine without a GPU that is the embedded default: a
# generated tiny model, router + 1 prefill + 1 decode worker (CPU backend), OpenAI API on
# http://127.0.0.1:8000/v1. Arguments go to `tandem serve`, e.g.
#   ./run.sh --layout deploy/layouts/2p2d.yaml
#   ./run.sh --model /models/Llama-3.1-8B-Instruct --layout deploy/layouts/h200x2.yaml
# Ctrl-C drains in-flight requests and stops everything.
set -euo pipefail
cd "$(dirname "$0")"
./deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" \
  --target tandem tandem-router tandem-prefill-worker tandem-decode-worker tandem-loadgen
exec "$BUILD_DIR/bin/tandem" serve "$@"
