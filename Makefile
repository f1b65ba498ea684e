# Two commands do everything on a fresh machine (Python 3.11, Node 22 or 24, or 20; no AWS credentials):
#   make synth   virtualenv + pinned CDK CLI, then `cdk synth` into cdk.out/
#   make test    every check: format, lint, types, tests (Ray config validation and the CPU
#                rehearsal included)
#   make rehearse  run the synthesized serve application on this CPU and probe it
#   make rehearse-faults  the same under load while a replica dies, the KV link is cut, the GCS dies
#   make rehearse-two-models  two models through one ingress; one model's decode changed restarts it alone
#   make rehearse-gpu / emulate-gpu / bench-gpu  the same on NVIDIA GPUs with the image's stack
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
VENV_RAY := .venv-ray
VENV_REHEARSE := .venv-rehearse
VENV_CHECKOV := .venv-checkov
VENV_GPU := .venv-gpu
# The GPU targets' Python: the virtualenv below, or any Python that already has the image's
# stack (GPU_PYTHON=python3 on a machine where it is installed).
GPU_PYTHON ?= $(VENV_GPU)/bin/python
GPU_ARGS ?=
# The package's CDK-free modules for a Python that has the GPU stack but not the package.
GPU_PATH := PYTHONPATH=$(CURDIR)/constructs$(if $(PYTHONPATH),:$(PYTHONPATH))
TEMPLATE := cdk.out/RayLlmPdServing.template.json
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
# jsii prints an end-of-life banner on every call under Node 20 (EOL 2026-10-30), which the CI
# machine runs; this silences it for Node 20 only (the value is the version it applies to). On
# Node 22 or 24 there is nothing to silence; upgrade if you see the banner outside make.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Byte-compiling every installed file (torch, vLLM, Ray: tens of thousands) costs minutes on a
# fresh machine; Python compiles what it imports, when it imports it.
export PIP_NO_COMPILE := 1

.PHONY: synth test test-core deps lint rayenv rehearse rehearse-faults rehearse-two-models rehearse-gpu rehearse-gpu-image emulate-gpu bench-gpu clean

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

$(VENV_CHECKOV)/.deps: requirements-checkov.txt
	test -x $(VENV_CHECKOV)/bin/python || $(PYTHON) -m venv $(VENV_CHECKOV)
	$(VENV_CHECKOV)/bin/python -m pip install -q -r requirements-checkov.txt
	touch $@

# At the lowest CPU priority: in `make test` it installs beside everything else and takes only
# the CPU they leave (lint and the tests mostly wait on node and subprocesses).
$(VENV_REHEARSE)/.deps: rehearsal/requirements.txt rehearsal/constraints.txt rehearsal/install.sh
	PYTHON=$(PYTHON) nice -n 19 rehearsal/install.sh $(VENV_REHEARSE)
	touch $@

node_modules/.deps: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.synth-deps node_modules/.deps
	$(CDK) synth --quiet
	@echo "templates in cdk.out/"

rayenv: $(VENV_RAY)/.deps

rehearse: $(VENV_REHEARSE)/.deps synth
	$(VENV_REHEARSE)/bin/python -m rehearsal.run --template cdk.out/RayLlmPdServing.template.json

# Faults under load on this CPU (replicas killed, the KV link cut, the GCS killed): about 9 minutes, not in `make test`.
# The GCS store on loopback is Debian's redis-server (installed here if missing; needs root).
rehearse-faults: $(VENV_REHEARSE)/.deps synth
	command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server
	command -v iptables >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iptables
	$(VENV_REHEARSE)/bin/python -m rehearsal.faults --template cdk.out/RayLlmPdServing.template.json

# Two models through one ingress on this CPU (the second added as a typed value), then one model's
# decode changed: only its application restarts. About 10 minutes, not in `make test`.
rehearse-two-models: $(VENV)/.test-deps $(VENV_REHEARSE)/.deps
	PYTHONPATH=constructs:. $(PY) -m rehearsal.two_models render .rehearsal/two-models.json
	PYTHONPATH=constructs:. $(VENV_REHEARSE)/bin/python -m rehearsal.two_models run .rehearsal/two-models.json

$(VENV_GPU)/.deps: rehearsal/gpu_install.sh constructs/eks_pd_serving/versions.py
	PYTHON=$(PYTHON) rehearsal/gpu_install.sh $(VENV_GPU)
	touch $@

# Only build the virtualenv when GPU_PYTHON is left at its default.
GPU_DEPS := $(if $(filter $(VENV_GPU)/bin/python,$(GPU_PYTHON)),$(VENV_GPU)/.deps)

rehearse-gpu: $(GPU_DEPS) synth
	$(GPU_PATH) $(GPU_PYTHON) -m rehearsal.gpu rehearse --template $(TEMPLATE) $(GPU_ARGS)

emulate-gpu: $(GPU_DEPS) synth
	$(GPU_PATH) $(GPU_PYTHON) -m rehearsal.gpu emulate --template $(TEMPLATE) --emulate-gpu L4 --model-shape full $(GPU_ARGS)

bench-gpu: $(GPU_DEPS) synth
	$(GPU_PATH) $(GPU_PYTHON) -m rehearsal.gpu bench --template $(TEMPLATE) $(GPU_ARGS)

# The same harness inside the serving image itself (its CUDA libraries, FlashInfer, EFA software):
# needs docker, the NVIDIA container toolkit and `docker login` to the image's ECR registry.
# Not run where this was developed (no docker on the GPU machine).
GPU_IMAGE ?= $(shell $(PY) -c 'from eks_pd_serving.versions import ray_image_uri; print(ray_image_uri("us-east-1"))')
rehearse-gpu-image: synth
	docker run --rm --gpus all --ipc host --network host -v $(CURDIR):/work -w /work -e PYTHONPATH=/work/constructs $(GPU_IMAGE) \
		python -m rehearsal.gpu rehearse --template $(TEMPLATE) $(GPU_ARGS)

lint: $(VENV)/.test-deps
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy app.py stacks constructs/eks_pd_serving tools rehearsal tests

CORE_DEPS := $(VENV)/.test-deps $(VENV_RAY)/.deps $(VENV_CHECKOV)/.deps node_modules/.deps
TEST_DEPS := $(CORE_DEPS) $(VENV_REHEARSE)/.deps
TEST_ENV := EKS_PD_RAY_PYTHON=$(abspath $(VENV_RAY))/bin/python EKS_PD_CHECKOV=$(abspath $(VENV_CHECKOV))/bin/checkov
# The tiers are folders of tests/: unit, template and gates need the core environments; rehearsal
# needs the rehearsal's virtualenv (vLLM CPU, several GB, the slowest to install).
REHEARSAL_TESTS := tests/rehearsal
REHEARSAL_ENV := $(TEST_ENV) EKS_PD_REHEARSE_PYTHON=$(abspath $(VENV_REHEARSE))/bin/python

# The environments are independent: installing them side by side shortens a fresh machine's wait
# (most of it is downloading and unpacking wheels).
deps:
	$(MAKE) --no-print-directory -j5 $(TEST_DEPS)

# On a fresh machine the rehearsal's virtualenv (the longest install) starts at once, at the
# lowest priority, while the other environments install and lint and every other test run; the
# rehearsal tests follow, the short ones (a broken config, no GPU) on a second worker beside the
# long one. Two pytest summaries; both must pass.
test:
	$(MAKE) --no-print-directory -j5 $(VENV_REHEARSE)/.deps test-core
	$(REHEARSAL_ENV) $(PY) -m pytest -n 2 --dist load --durations=5 $(REHEARSAL_TESTS)

# Two workers, one test file each at a time: most tests wait on jsii's node process or a
# subprocess, so one core would otherwise sit idle once the rehearsal's virtualenv is installed.
test-core: lint $(CORE_DEPS)
	$(TEST_ENV) $(PY) -m pytest -n 2 --dist loadfile --durations=10 tests/unit tests/template tests/gates

clean:
	rm -rf cdk.out .rehearsal .pytest_cache .mypy_cache .ruff_cache
