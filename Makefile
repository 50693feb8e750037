# Every target sets itself up: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
JOB    ?= jobs/local.yaml
# Machines without an NVIDIA driver get torch's CPU build (1 GB, local wheel where one
# exists); machines with one get the default CUDA build. Override: make TORCH=torch==X.
TORCH  ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: run test test-fast gpu-check lint bench submit logs plan minicluster minicluster-stop build docker-run clean

# What running needs (make run, submit, logs ...); the test tier's clients, linters, profilers
# and the browser driver come with .dev (make test, lint, bench).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet "$(TORCH)"
	$(VENV)/bin/pip install --quiet -e .
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

run: $(VENV)/.installed  ## the embedded default: jobs/local.yaml, 4 ranks on this machine (the local launcher); ARGS="key=value ..." on top
	$(PY) -m cluster submit jobs/local.yaml --wait $(ARGS)

submit: $(VENV)/.installed  ## make submit JOB=jobs/multi_node.yaml [ARGS="nodes=4 train.steps=200"]
	$(PY) -m cluster submit $(JOB) $(ARGS)

plan: $(VENV)/.installed
	$(PY) -m cluster plan $(JOB) $(ARGS)

logs: $(VENV)/.installed  ## make logs JOB=<job id or runs/NAME/ID>
	$(PY) -m cluster logs $(JOB) $(ARGS)

minicluster:  ## a real SLURM cluster on this machine: 3 nodes x 4 fake GPUs (root; installs slurm-wlm)
	$(PYTHON) -m cluster.system.minicluster start

minicluster-stop:
	$(PYTHON) -m cluster.system.minicluster stop

test: $(VENV)/.dev  ## the whole suite: unit, golden, real multi-process, real clients, SLURM and image tiers (the SLURM tier side by side with the rest)
	PY=$(PY) tests/provision.sh
	$(PY) tests/suite.py

test-fast: $(VENV)/.dev  ## unit and golden tests only
	$(PY) -m pytest -m "not slow and not slurm and not remote and not image and not clients and not browser"

# On a GPU box's own environment (its CUDA torch, no package registry): make gpu-check PY=python3
# skips the venv; that interpreter needs pytest, pyyaml and orjson (docs/benchmarking.md).
# Only the gpu tier's files are collected: the others import submitit and docker at the top.
GPU_TESTS := tests/gpu tests/bench/test_gpu_bench.py
gpu-check: $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.dev)  ## on a CUDA machine: the gpu tier, bench.gpu's table (MFU) and the asynchronous save's, under 10 minutes on one GPU
	status=0; \
	$(PY) -m pytest -m gpu -rs -p no:cacheprovider $(GPU_TESTS) || status=1; \
	$(PY) -m bench.gpu --compile || status=1; \
	$(PY) -m bench.checkpoints --device cuda --sizes-mb 1000,2000 || status=1; \
	exit $$status  # every part runs (one lent GPU, one try); 1 where any failed

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.dev  ## every benchmark in one run -> docs/benchmarks.md and docs/*.png (make minicluster first for SLURM)
	$(PY) -m bench.report

IMAGE ?= torch-cluster-kit:latest
build:  ## the image, with docker when an engine answers, else podman (same arguments)
	IMAGE=$(IMAGE) docker/build.sh

docker-run: $(VENV)/.installed  ## train in the image: jobs/docker.yaml through the Docker SDK (CLI fallback): make docker-run ARGS="train.steps=100"
	IMAGE=$(IMAGE) PY=$(PY) docker/run.sh $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
