# The two commands a new machine needs: `make demo` (the main job) and `make test`.
# Each installs what it needs: Debian packages when missing, the venv, the project.
VENV := .venv
PY := $(VENV)/bin/python
# Spark's Python workers must run the venv's Python (it has pyarrow, pandas and Tally).
export PYSPARK_PYTHON := $(abspath $(PY))
# The Spark sink's tests and the demo run a JVM (setup.sh adds its JDK, whose javac builds the
# JVM reader's jar).
JAVA_PKG := openjdk-17-jre-headless
TEST_WORKERS ?= 2

.PHONY: demo test venv bench api-docs

# setup.sh skips what is installed and unchanged (a stamp in the venv; the native modules
# are compiled again only when their sources change), so each target runs it every time.
venv:
	bash scripts/setup.sh

# The demo needs the Spark extra; the tests need [test] (Spark, pytest, import-linter, ...).
demo:
	EXTRAS=spark bash scripts/setup.sh $(JAVA_PKG)
	$(VENV)/bin/tally demo

# The cluster tests run a real ZooKeeper, the fault harness iptables (tests/faults: network
# faults in namespaces of its own): setup.sh installs Debian's packages when missing (and
# refreshes the venv), every time, so a machine that lacks it gets it. Idempotent, and quick
# when nothing changed.
# lint-imports checks the layer contracts of pyproject.toml first: a wrong arrow fails the run.
# The suite runs in TEST_WORKERS pytest-xdist workers, one per core: the Spark tests on one
# worker, in order, sharing its one SparkSession, the rest on the other (in a run with 3
# workers on a loaded machine, Spark's Python workers timed out connecting back).
test:
	bash scripts/setup.sh zookeeper iptables $(JAVA_PKG)
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadgroup tests

bench: venv
	$(VENV)/bin/tally bench

# The API reference of the public face, as HTML in docs/api/ (generated, not committed).
api-docs:
	EXTRAS=spark,docs bash scripts/setup.sh
	$(PY) scripts/api_docs.py docs/api
