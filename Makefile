# `make demo` and `make test` do all set-up on a fresh machine; both are idempotent.
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.armorlab-installed
TORCH_CPU ?= torch==2.13.0
PYTEST_ARGS ?=
# pip on this kind of machine warns about missing mirror folders; keep re-runs quiet.
PIPQ = 2>&1 | { grep -v -e "is ignored: it is neither" -e "^$$" || true; }

export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help install demo test lint bench clean

help:
	@echo "make demo   - create $(VENV), install, run the validation-collapse demo on the tiny model"
	@echo "make test   - create $(VENV), install, run the test suite"
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
	@$(PY) -m pip install -q -e ".[dev]" $(PIPQ)
	@touch $(STAMP)

install: $(STAMP)

demo: install
	@$(VENV)/bin/armorlab demo

test: install
	@$(PY) -m pytest -q $(PYTEST_ARGS)

lint: install
	@$(VENV)/bin/ruff check armorlab tests benchmarks

bench: install
	@for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f; done

clean:
	rm -rf $(VENV) .pytest_cache
