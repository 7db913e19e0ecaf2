# Two commands on a fresh machine: `make run` and `make test`. Everything they need is
# installed from here: the venv and its packages, and Debian packages when missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
# `make run` installs what the cluster and the CLI need (about 100 MB). The Spark audits'
# packages (pyspark, pyarrow, pandas, numpy: about 800 MB more) are the `audit` extra,
# which `make audit` adds; `make test` installs the test tools (pytest, hypothesis, ruff,
# mypy, import-linter, atheris, ...) and the audit extra. A stamp per set, named by
# pyproject.toml's hash: changing pyproject.toml installs again.
STAMP := $(VENV)/.installed-run-$(HASH)
AUDIT_STAMP := $(VENV)/.installed-audit-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)
DATA_DIR ?= ./data
# pip's own output goes to PIP_LOG, printed only if pip fails: each set-up stage is one line.
PIP_LOG := $(VENV)/pip.log
PIP_INSTALL := $(BIN)/python -m pip install --disable-pip-version-check --progress-bar off
PIP_FAILED := { cat $(PIP_LOG); echo "error: pip install failed (its output is above and in $(PIP_LOG))" >&2; exit 1; }

.PHONY: setup setup-test audit system run test lint layers typecheck core-coverage pytest bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "creating the venv ($(VENV))"; $(PYTHON) -m venv $(VENV); }
	@echo "installing packages (about 100 MB, a minute or two on a first run; pip's output: $(PIP_LOG))"
	@: > $(PIP_LOG)
	@$(PIP_INSTALL) --upgrade pip >> $(PIP_LOG) 2>&1 || $(PIP_FAILED)
	@$(PIP_INSTALL) -e . >> $(PIP_LOG) 2>&1 || $(PIP_FAILED)
	@rm -f $(VENV)/.installed-run-*
	@touch $(STAMP)

$(AUDIT_STAMP): $(STAMP)
	@echo "installing the audits' packages: pyspark, pyarrow, pandas (about 800 MB, a few minutes on a first run)"
	@: > $(PIP_LOG)
	@$(PIP_INSTALL) -e '.[audit]' >> $(PIP_LOG) 2>&1 || $(PIP_FAILED)
	@rm -f $(VENV)/.installed-audit-*
	@touch $(AUDIT_STAMP)

$(TEST_STAMP): $(STAMP)
	@echo "installing the test tools and the audits' packages (about 1.1 GB, a few minutes on a first run)"
	@: > $(PIP_LOG)
	@$(PIP_INSTALL) -e '.[test,audit]' >> $(PIP_LOG) 2>&1 || $(PIP_FAILED)
	@rm -f $(VENV)/.installed-test-* $(VENV)/.installed-audit-*
	@touch $(TEST_STAMP) $(AUDIT_STAMP)

setup: $(STAMP)

setup-test: $(TEST_STAMP)

# The Spark audits' packages (the `audit` extra), installed into the venv; it runs no
# audit (that takes a JRE too: `make system`), it says how.
audit: $(AUDIT_STAMP)
	@echo "audits installed: $(BIN)/metactl audit all --data-dir $(DATA_DIR) (they need a JRE: make system)"

# Debian packages, installed when missing: a JRE (the Spark audits, `metactl audit`),
# etcd-server (`cluster up --etcd`, HA) and prometheus (DATA_DIR/prometheus.yml, the alert
# tests). `make test` needs all three; `make run` needs none of them, and installs none
# (that takes root and ~300 MB): each command that lacks one says so in one line naming
# `make system` (JAVA_NOT_FOUND for an audit, INVALID_CONFIG for --etcd).
system:
	@./scripts/ensure-system-packages.sh

run: setup
	@echo "starting the cluster: $(BIN)/metactl cluster up --brokers 3 --data-dir $(DATA_DIR)"
	@$(BIN)/metactl cluster up --brokers 3 --data-dir $(DATA_DIR)

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
