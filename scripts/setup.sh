#!/usr/bin/env bash
# Installs everything Tally needs on a fresh Debian machine: Debian packages when missing,
# then the venv with the project and its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
echo "setup: installing the project into .venv"
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
