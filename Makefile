# The two commands a new machine needs: `make demo` (the main job) and `make test`.
# Each installs what it needs: Debian packages when missing, the venv, the project.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test venv bench

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

demo: venv
	$(VENV)/bin/tally demo

# The cluster tests run a real ZooKeeper: setup.sh installs Debian's package when missing (and
# refreshes the venv), every time, so a machine that lacks it gets it. Idempotent and quick.
test:
	bash scripts/setup.sh zookeeper
	touch $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests

bench: venv
	$(VENV)/bin/tally bench
