#!/usr/bin/env bash
# Installs everything tandem needs on a fresh Debian 12 machine: the Debian packages listed in
# deploy/packages.txt, and with --with-python (for tests only) the Debian packages of
# deploy/packages-test.txt (prometheus, systemd, chromium, clang) and a Python virtual
# environment in .venv with the reference tooling (tokenizers, the OpenAI client,
# kubernetes-validate).
# Idempotent; run as root or with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
lists=(deploy/packages.txt)
if [ "${1:-}" = "--with-python" ]; then lists+=(deploy/packages-test.txt); fi
mapfile -t pkgs < <(cat "${lists[@]}" | grep -vE '^\s*(#|$)')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "${1:-}" = "--with-python" ]; then
  if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
  .venv/bin/python -m pip install -q --disable-pip-version-check -r deploy/requirements-test.txt
fi
