# treetune-verl: the two commands of the README, plus a few helpers.
#   make demo [ARGS="key=value ..."]   CPU tiny run of the main recipe (writes outputs/demo/)
#   make experiment [ARGS="--quick ..."]  CPO vs matched GRPO on CPU (writes outputs/experiments/cpo_vs_grpo/)
#   make test                           CPU test tier
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.treetune-installed

.PHONY: install demo experiment test test-gpu lint clean-assets

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

# torch first, then everything else under a constraint that pins the torch just installed.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e ".[test,math]"
	touch $(STAMP)

install: $(STAMP)

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
