# Quick start: `make reproduce` (set up .venv and reproduce the paper), `make test` (set up and
# run the tests). Both need only Python 3.11+ and pip.
#
# TORCH is what pip installs first. The default pins the release whose CPU build this project is
# developed on; on a machine with a GPU or another platform, choose your own, e.g.
#   make test TORCH=torch
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup reproduce quick test lint bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

reproduce: $(STAMP)
	$(BIN)/sinklab reproduce --out results/reproduce

quick: $(STAMP)
	$(BIN)/sinklab reproduce --quick --out results/quick

test: $(STAMP)
	$(BIN)/python -m pytest

# Training speed against a reference-style loop (docs/performance.md).
bench: $(STAMP)
	$(BIN)/python benchmarks/train_speed.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# Regenerate docs/reproduction.md and its figures from a fresh default reproduction.
docs: $(STAMP)
	rm -rf results/docs-reproduce
	$(BIN)/sinklab reproduce --out results/docs-reproduce --docs docs/reproduction.md

clean:
	rm -rf $(VENV) results runs
