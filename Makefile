# The commands a person uses. Everything bootstraps from a clean clone:
# a private tools venv holds the pinned uv, uv builds .venv from uv.lock.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
export UV_LINK_MODE := copy
# Bytecode is compiled once here: where PYTHONDONTWRITEBYTECODE is set (this
# machine, CI, containers) every process would otherwise compile every module it
# imports from source, seconds of CPU per service start.
export UV_COMPILE_BYTECODE := 1

.PHONY: help bootstrap lint typecheck imports test unit integration bench clean demo

help:
	@echo "make demo       start Flotilla on this machine, drain a cluster under a live app, stop it"
	@echo "make test       lint, typecheck, import contracts and every test (real NATS/Redis started by the tests)"
	@echo "make unit       fast tests only (no integration marker)"
	@echo "make bench      run the benchmarks under bench/ and print JSON"
	@echo "make bootstrap  create .venv from uv.lock"

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)
	$(UV) sync --frozen --all-packages --python $(PYTHON)
	$(PY) -m compileall -q -j 0 libs/*/src services/*/src
	@touch $@

bootstrap: $(VENV)/.synced

demo: bootstrap
	$(VENV)/bin/flotilla --state-dir .flotilla demo

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: bootstrap
	$(VENV)/bin/mypy libs/common/src libs/kubesim/src libs/cli/src $(wildcard services/*/src) bench

imports: bootstrap
	$(VENV)/bin/lint-imports

test: lint typecheck imports
	$(VENV)/bin/pytest -p no:cacheprovider

unit: bootstrap
	$(VENV)/bin/pytest -p no:cacheprovider -m "not integration"

integration: bootstrap
	$(VENV)/bin/pytest -p no:cacheprovider -m integration

bench: bootstrap
	$(PY) bench/bus.py
	$(PY) bench/capacity.py
	$(PY) bench/scheduler.py
	$(PY) bench/io_floor.py
	$(PY) bench/scheduler_instructions.py
	$(PY) bench/kubesim.py
	$(PY) bench/transformer.py
	$(PY) bench/syncer.py
	$(PY) bench/drain.py
	$(PY) bench/pipeline.py

lock: $(UV)
	$(UV) lock

clean:
	rm -rf $(VENV) $(TOOLS)
