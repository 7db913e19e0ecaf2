# Two commands on a fresh machine: `make run` and `make test`. Everything they need is
# installed from here: the venv and its packages, and Debian packages when missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
# `make run` installs what the cluster and the audits need; `make test` adds the test
# tools (pytest, hypothesis, ruff, mypy, import-linter, atheris, ...).
STAMP := $(VENV)/.installed-run-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)
DATA_DIR ?= ./data

.PHONY: setup setup-test system run test lint layers typecheck core-coverage pytest bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@rm -f $(VENV)/.installed-run-*
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@rm -f $(VENV)/.installed-test-*
	@touch $(TEST_STAMP)

setup: $(STAMP)

setup-test: $(TEST_STAMP)

# Debian packages, installed when missing: a JRE (the Spark audits, `metactl audit`),
# etcd-server (`cluster up --etcd`, HA) and prometheus (DATA_DIR/prometheus.yml, the alert
# tests). `make test` needs all three; `make run` needs none of them, and installs none
# (that takes root and ~300 MB): each command that lacks one says so in one line naming
# `make system` (JAVA_NOT_FOUND for an audit, INVALID_CONFIG for --etcd).
system:
	@./scripts/ensure-system-packages.sh

run: setup
	$(BIN)/metactl cluster up --brokers 3 --data-dir $(DATA_DIR)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The package layering (pyproject.toml [tool.importlinter]): the core imports no runtime,
# metactl/ imports nothing of the project, the brokers and audits use the image package.
layers: setup-test
	$(BIN)/lint-imports

typecheck: setup-test
	$(BIN)/mypy

# The pure core (the controller's core folder and the image package) is held to 100%
# branch coverage. Coverage is about reach, so this pass runs the property tests with a
# small, fixed-seed budget; `pytest` below runs them with their full budget.
CORE := controller/core/*,metadata_image/*
core-coverage: setup-test
	METACTL_HYPOTHESIS_EXAMPLES=50 $(BIN)/coverage run --branch --source=controller,metadata_image --data-file=.coverage.core -m pytest -q -p no:cacheprovider --hypothesis-seed=0 tests/controller
	$(BIN)/coverage report --data-file=.coverage.core --include='$(CORE)' --fail-under=100 --show-missing --skip-covered

# On both cores (pytest-xdist): the tests wait on real processes much of the time. A
# worker takes a test file at a time, and one takes every audit test, with the run's one
# Spark session (tests/conftest.py, pytest_xdist_make_scheduler); tests/e2e/cluster.py
# gives each worker its own port range.
pytest: setup-test system
	$(BIN)/python -m pytest -n 2

test: lint layers typecheck core-coverage pytest

bench: setup-test system
	$(BIN)/python bench/log_append.py
	$(BIN)/python bench/controller_ops.py
	$(BIN)/python bench/service_load.py
	$(BIN)/python bench/produce.py
	$(BIN)/python bench/ha.py
	$(BIN)/python bench/lifecycle.py
	$(BIN)/python bench/connection_flood.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
