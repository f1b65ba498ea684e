# Two commands do everything on a fresh machine (Python 3.11, Node 20, no AWS credentials):
#   make synth   virtualenv + pinned CDK CLI, then `cdk synth` into cdk.out/
#   make test    every check: format, lint, types, tests (Ray config validation included)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
VENV_RAY := .venv-ray
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
# Node 20 is the Node this machine has; jsii prints a banner on every call without this.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: synth test check lint rayenv clean

$(VENV)/.synth-deps: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.test-deps: $(VENV)/.synth-deps requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

$(VENV_RAY)/.deps: requirements-ray.txt
	test -x $(VENV_RAY)/bin/python || $(PYTHON) -m venv $(VENV_RAY)
	$(VENV_RAY)/bin/python -m pip install -q -r requirements-ray.txt
	touch $@

node_modules/.deps: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.synth-deps node_modules/.deps
	$(CDK) synth --quiet
	@echo "templates in cdk.out/"

rayenv: $(VENV_RAY)/.deps

lint: $(VENV)/.test-deps
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy app.py stacks constructs/eks_pd_serving k8s tools

test: $(VENV)/.test-deps $(VENV_RAY)/.deps node_modules/.deps lint
	EKS_PD_RAY_PYTHON=$(abspath $(VENV_RAY))/bin/python $(PY) -m pytest

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
