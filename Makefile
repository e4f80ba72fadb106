# gpuguard: `make demo` runs the main job, `make test` runs every test (lint and types too).
# Both build the virtual environment from nothing on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpuguard needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	@hack/demo.sh $(BIN)/gpuguard

lint: venv
	$(BIN)/ruff check src tests bench hack
	$(BIN)/ruff format --check src tests bench hack
	$(BIN)/lint-imports --no-cache

typecheck: venv
	$(BIN)/mypy

unit: venv
	@hack/pytest.sh $(BIN)/python

test: lint typecheck unit

# The chart's CRD, generated from the wire model (tests/unit/test_contract_crd.py checks it).
.PHONY: crds
crds: venv
	$(BIN)/python -m gpuguard.contract.crd deploy/helm/gpuguard/crds/noderemediations.yaml

bench: venv
	$(BIN)/python bench/kernel_log_scan.py
	$(BIN)/python bench/check_bundle.py
	$(BIN)/python bench/simulate.py --quick
	$(BIN)/python bench/checkpoint_cost.py
	$(BIN)/python bench/node_list_decode.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
