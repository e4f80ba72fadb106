# gpuguard: `make demo` runs the main job, `make test` runs every test (lint and types too).
# Both build the virtual environment from nothing on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint typecheck unit bench clean image

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpuguard needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,torch]'
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

# The image the chart runs, built from the Dockerfile with buildah (no Docker engine needed).
# IMAGE_BASE replaces the Dockerfile's FROM (a local image, never pulled), as the tests do
# with hack/node-env's Debian base; the host's CA bundle is mounted for the build only, for
# pip behind a TLS-inspecting proxy. BUILDAH may carry storage options (--root ...).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= gpuguard/gpuguard:$(VERSION)
IMAGE_BASE ?=
BUILDAH ?= buildah
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt

# With buildah when it is installed, else with docker.
image:
ifneq ($(shell command -v $(firstword $(BUILDAH)) 2>/dev/null),)
	$(BUILDAH) build --isolation chroot --network host --layers=false \
	  $(if $(IMAGE_BASE),--from $(IMAGE_BASE) --pull=never) \
	  $(if $(wildcard $(CA_BUNDLE)),--volume $(CA_BUNDLE):/etc/ssl/certs/ca-certificates.crt:ro) \
	  --tag $(IMAGE) --file Dockerfile .
else
	@command -v docker >/dev/null || { echo "make image: needs buildah or docker" >&2; exit 1; }
	docker build --network host --tag $(IMAGE) --file Dockerfile .
endif

# The chart as a package ($(CHART_DIR)/gpuguard-VERSION.tgz); with CHART_REGISTRY set
# (oci://registry.example.com/charts), also pushed there as an OCI artifact
# (HELM_PUSH_FLAGS: e.g. --plain-http for a registry without TLS).
HELM ?= helm
CHART_DIR ?= out
CHART_REGISTRY ?=
HELM_PUSH_FLAGS ?=
.PHONY: chart
chart:
	@mkdir -p $(CHART_DIR)
	$(HELM) package deploy/helm/gpuguard --destination $(CHART_DIR)
	$(if $(CHART_REGISTRY),$(HELM) push $(HELM_PUSH_FLAGS) $(CHART_DIR)/gpuguard-$(VERSION).tgz $(CHART_REGISTRY))

# The chart's CRD, generated from the wire model (tests/unit/test_contract_crd.py checks it).
.PHONY: crds
crds: venv
	$(BIN)/python -m gpuguard.contract.crd deploy/helm/gpuguard/crds/noderemediations.yaml

# docs/img/dashboard-*.svg: both dashboards drawn from their own queries against the real
# Prometheus of tests/kube/test_prometheus_server.py (its scenario, about a minute).
.PHONY: dashboard-images
dashboard-images: venv
	DASHBOARD_IMAGES=docs/img $(BIN)/python -m pytest -q -p no:cacheprovider \
	  tests/kube/test_prometheus_server.py

bench: venv
	$(BIN)/python bench/kernel_log_scan.py
	$(BIN)/python bench/check_bundle.py
	$(BIN)/python bench/simulate.py --quick
	$(BIN)/python bench/checkpoint_cost.py
	$(BIN)/python bench/node_list_decode.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
