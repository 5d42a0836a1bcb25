#!/usr/bin/env bash
# Installs everything Tally needs on a fresh Debian machine: Debian packages when missing,
# then the venv with the project and the extras asked for. Safe to run again, and quick
# when nothing changed.
#
#   EXTRAS=spark bash scripts/setup.sh openjdk-17-jre-headless   # what `make demo` runs
#   bash scripts/setup.sh zookeeper openjdk-17-jre-headless        # `make test`: EXTRAS=test
#   EXTRAS=spark,docs bash scripts/setup.sh                         # `make api-docs`
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS:-test}

# The JVM reader's jar is compiled (scripts/build_jvm_reader.sh): a Java runtime asked for
# comes with its compiler.
pkgs=()
for pkg in "$@"; do
  pkgs+=("$pkg")
  case "$pkg" in openjdk-*-jre-headless) pkgs+=("${pkg%-jre-headless}-jdk-headless") ;; esac
done
need_apt=()
for pkg in "${pkgs[@]}"; do
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
# The venv's stamp says what is installed from which inputs: an unchanged tree with its extras
# in is not installed again, missing extras are added without rebuilding the project, and a
# changed one is reinstalled (setup.py recompiles only the native modules whose sources
# changed). SETUP_FORCE=1 reinstalls all the same.
mapfile -t plan < <(.venv/bin/python scripts/install_state.py plan "$EXTRAS")
[ "${SETUP_FORCE:-0}" = 1 ] && plan=(project)
case "${plan[0]:-}" in
  current)
    echo "setup: .venv is current with [$EXTRAS]" ;;
  extras)
    echo "setup: adding [$EXTRAS]'s requirements to .venv"
    .venv/bin/pip install -q --disable-pip-version-check "${plan[@]:1}"
    .venv/bin/python scripts/install_state.py record "$EXTRAS" ;;
  project)
    # The distribution was called `tally` before it took a name of its own on PyPI; an old
    # editable install would still claim the `tally` command.
    if .venv/bin/pip show -q tally >/dev/null 2>&1; then
      .venv/bin/pip uninstall -y -q --disable-pip-version-check tally
    fi
    echo "setup: installing the project into .venv with [$EXTRAS]"
    .venv/bin/pip install -q --disable-pip-version-check -e ".${EXTRAS:+[$EXTRAS]}"
    .venv/bin/python scripts/install_state.py record "$EXTRAS" ;;
  *) exit 1 ;;  # install_state.py said why on stderr
esac
# The JVM reader's jar (format("tally-jvm"), sink.read_table), where pyspark and javac are
# installed; rebuilt whenever its sources change.
if .venv/bin/python -c 'import pyspark' 2>/dev/null && command -v javac >/dev/null; then
  bash scripts/build_jvm_reader.sh .venv/bin/python
fi
