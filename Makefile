# The README's commands. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch first, pinned to the CPU wheel on disk: an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: help install run bench bench-remote sweep compare sft lint test test-long test-cluster test-fast clean-outputs

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed  ## create .venv with torch (CPU) and the project

run: install  ## the main job on the embedded default: GRPO + OPPO overlap from the SFT checkpoint (built on first use)
	$(PY) -m asr_grpo.run overlap=oppo placement=colocate

bench: install  ## OPPO speedup benchmark, default workload (~25 min on 2 cores): none|intra|inter|oppo -> bench/results/cpu_2core/
	$(PY) bench/overlap_speedup.py --workloads default --out bench/results/cpu_2core

bench-remote: install  ## overlap with a reward served by another machine (~45 min on 2 cores): none|oppo x 3 service settings x 3 repeats, with intervals -> bench/results/cpu_2core_remote_reward/
	$(PY) bench/remote_reward.py --repeats 3

sweep: install  ## the speedup study as a Hydra sweep: overlap none|oppo x placement x seed 0|1 (8 MLflow runs)
	$(PY) -m asr_grpo.run -m experiment=speedup

compare: install  ## the speedup report of the latest sweep: table + plots -> outputs/reports/, logged to MLflow
	$(PY) -m asr_grpo.compare

sft: install  ## SFT warm start only: corpus + tiny Qwen3-ASR, prints dev CER
	$(PY) -m asr_grpo.sft

lint: install  ## ruff (pyproject.toml [tool.ruff]): style, unused names, import order, likely bugs
	$(VENV)/bin/ruff check .

test: lint  ## ruff, then the test suite (slow tests included; the long real runs and the two-node cluster test are legs of their own), as CI runs it
	$(PY) -m pytest -q -m "not cluster and not long"

test-long: install  ## the long real runs (resume, signals, faults, LoRA, objectives, sweeps), CI's second leg
	$(PY) -m pytest -q -m long

test-cluster: install  ## the two-node Ray cluster test on loopback (~3.5 min), CI's second leg
	$(PY) -m pytest -q -m cluster

test-fast: install  ## the suite without slow multi-process tests
	$(PY) -m pytest -q -m "not slow"

clean-outputs:  ## remove corpus cache, checkpoints, MLflow store
	find outputs -mindepth 1 ! -name .gitignore -exec rm -rf {} +
