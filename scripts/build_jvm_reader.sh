#!/usr/bin/env bash
# Builds the JVM reader's jar (jvm/build/tally-spark-reader.jar) from jvm/src with javac,
# against the jars of the venv's pyspark (no Maven). Does nothing when the jar was built from
# the same sources and pyspark; safe to run again.
#
#   bash scripts/build_jvm_reader.sh [PYTHON]     # PYTHON: default .venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
JAR=jvm/build/tally-spark-reader.jar
spark_jars=$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
stamp=$( (cd jvm/src && find . -type f | LC_ALL=C sort | xargs sha256sum; ls "$spark_jars" | grep '^spark-sql_') | sha256sum | cut -d' ' -f1)
if [ -f "$JAR" ] && [ "$(cat jvm/build/sources.sha256 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
if ! command -v javac >/dev/null || ! command -v jar >/dev/null; then
  echo "build_jvm_reader: javac and jar are missing: install openjdk-17-jdk-headless" >&2
  exit 1
fi
echo "setup: building $JAR"
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac -nowarn --release 17 -cp "$spark_jars/*" -d "$classes" $(find jvm/src/main/java -name '*.java')
cp -r jvm/src/main/resources/. "$classes/"
mkdir -p jvm/build
jar cf "$JAR.tmp" -C "$classes" .
mv "$JAR.tmp" "$JAR"
echo "$stamp" > jvm/build/sources.sha256
