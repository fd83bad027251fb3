# treetune-verl: the two commands of the README, plus a few helpers.
#   make demo [ARGS="key=value ..."]   CPU tiny run of the main recipe (writes outputs/demo/)
#   make experiment [ARGS="--quick ..."]  CPO vs matched GRPO on CPU (writes outputs/experiments/cpo_vs_grpo/)
#   make test                           CPU test tier
#   make install-gpu ROLLOUT=vllm       GPU node: torch + serving engine + flash-attn + this project (or ROLLOUT=sglang)
#   make check-gpu-install              resolve every GPU stack from the index in a throwaway environment
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ROLLOUT ?= vllm
ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.treetune-installed
CONSTRAINT := $(VENV)/torch-constraint.txt
GPU_INSTALL := -m treetune_scripts.gpu_install

.PHONY: install install-gpu check-gpu-install demo experiment test test-gpu lint clean-assets

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

# torch first, then everything else under a constraint that pins the torch just installed (the distribution's
# version, e.g. 2.9.0: torch.__version__ adds a local tag such as +cu128 that no index serves).
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) $(GPU_INSTALL) torch-constraint > $(CONSTRAINT)
	$(PY) -m pip install -q -c $(CONSTRAINT) -e ".[test,math]"
	touch $(STAMP)

install: $(STAMP)

# One serving stack per environment (vLLM and SGLang need different torch releases); see treetune_scripts/gpu_install.py.
install-gpu: $(PY)
	$(PY) $(GPU_INSTALL) install --rollout $(ROLLOUT) --python $(PY) --constraint-file $(CONSTRAINT)
	touch $(STAMP)

check-gpu-install: $(STAMP)
	$(PY) $(GPU_INSTALL) check --python $(PY)

demo: $(STAMP)
	$(PY) -m treetune_scripts.run_demo $(ARGS)

experiment: $(STAMP)
	$(PY) -m treetune_scripts.experiments.cpo_vs_grpo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $$(find treetune_tests -name 'test_*_on_cpu.py' | sort)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu treetune_tests

lint: $(STAMP)
	$(VENV)/bin/pre-commit run --all-files

clean-assets:
	rm -rf .cache/tiny_assets
