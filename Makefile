# ragplane task file: the README, CI and pre-commit all call these targets.
# `make help` lists them.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.DEFAULT_GOAL := help
.PHONY: help install serve test test-all lint protos protos-check bench loadtest clean

help: ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt embedder_rs/Cargo.toml scripts/install.sh
	$(PYTHON) -m venv $(VENV)
	VENV=$(VENV) bash scripts/install.sh
	touch $@

install: $(VENV)/.installed ## create .venv with the service, embedder_rs and dev tools

serve: install ## install everything and serve on 127.0.0.1:50051 (SQLite + FAISS, one process)
	$(VENV)/bin/ragplane serve

protos: install ## regenerate ragplane/v1 from protos/
	$(PY) scripts/gen_protos.py

protos-check: install ## fail if ragplane/v1 is stale
	$(PY) scripts/gen_protos.py --check

lint: install ## ruff over our code (generated code excluded)
	$(VENV)/bin/ruff check server index tests bench loadtest scripts

test: install protos-check lint ## install everything and run the tests (unit, e2e, parity)
	bash scripts/run_tests.sh

test-all: install ## also the slow tests
	bash scripts/run_tests.sh -m "not gpu"

bench: install ## side-by-side benchmarks; writes BENCHMARKS.md
	$(PY) -m bench

clean: ## remove the venv and build outputs
	rm -rf $(VENV) embedder_rs/target ragplane-data
