# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install demo dev test test-slow lint bench simulate chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# an editable install leaves our modules uncompiled: where PYTHONDONTWRITEBYTECODE is set (containers, CI),
	# every run's CLI and step process would compile them again (~0.2 s of CPU each)
	$(BIN)/python -m compileall -q ingestion_assets
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/ingest demo

dev: install
	$(BIN)/ingest dev

test: install
	$(BIN)/ruff check ingestion_assets ingestion_assets_tests bench
	$(BIN)/python -m pytest

test-slow: install
	$(BIN)/python -m pytest -m slow

lint: install
	$(BIN)/ruff check ingestion_assets ingestion_assets_tests bench
	$(BIN)/mypy

# `make simulate SEED=1002` replays one seed exactly (KIND=table|api|cdc|cdch|cdcl|files|all; cdch: CDC history partitions, cdcl: CDC live runs, files: a files stream); `make simulate RUNS=200` runs many more.
SEED ?=
RUNS ?= 20
START ?= 1000
ROUNDS ?= 6
KIND ?= all
simulate: install
	$(BIN)/python -m ingestion_assets_tests.simulation $(if $(SEED),--seed $(SEED),--runs $(RUNS) --start $(START)) \
		--rounds $(ROUNDS) --kind $(KIND) $(if $(UNSAFE),--unsafe)

# Real chaos through Dagster: `make chaos TRIALS=100 CHAOS_SEED=7` (RELIABILITY.md records the figures).
TRIALS ?= 30
CHAOS_SEED ?= 1
chaos: install
	$(BIN)/python -m ingestion_assets_tests.chaos --trials $(TRIALS) --seed $(CHAOS_SEED)

bench: install
	$(BIN)/python bench/postgres_to_duckdb.py

clean:
	-$(BIN)/ingest down
	rm -rf .ingest
