# rmq-txn-reconcile: `make run` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SAMPLE_STORE ?= sample/broker-a
SAMPLE_OUTPUT ?= sample/output
SAMPLE_TRANSACTIONS ?= 3000
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.DEFAULT_GOAL := help
.PHONY: bench-writers help run test test-delta test-notebook test-airflow report lint format clean package venv bench bench-scaleout

help: ## Show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## Create .venv and install the project with its dev tools

$(SAMPLE_STORE)/commitlog: | $(STAMP)
	$(BIN)/python -m jobs.simulate --out $(SAMPLE_STORE) --transactions $(SAMPLE_TRANSACTIONS) --seed 7

run: $(STAMP) $(SAMPLE_STORE)/commitlog ## Simulate a sample broker store (once), reconcile it, print the summary
	$(BIN)/python -m jobs.reconcile --store $(SAMPLE_STORE) --as-of latest --output $(SAMPLE_OUTPUT)
	$(BIN)/python -m jobs.report --output $(SAMPLE_OUTPUT)

test: $(STAMP) ## Run the test suite
	$(BIN)/python -m pytest

test-delta: $(STAMP) ## delta-spark tests in a session with Delta's jars (first run fetches them into ~/.cache/rmq-txn-reconcile/ivy)
	$(BIN)/python -m pytest -m delta tests/delta

test-notebook: $(STAMP) ## Execute examples/audit.ipynb top to bottom
	$(BIN)/python -m pytest -m notebook tests/report/test_notebook.py

test-airflow: ## Airflow DAG test in its own venv (~/.cache/rmq-txn-reconcile/venv-airflow)
	bash tests/airflow/run.sh

report: $(STAMP) ## Write the HTML report of the newest run in $(SAMPLE_OUTPUT) and print its path
	$(BIN)/python -m jobs.report --output $(SAMPLE_OUTPUT)

lint: $(STAMP) ## ruff check and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

BENCH_STAMP := $(VENV)/.bench-stamp
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) ## Benchmark 1M/4M/16M x3 + scale-out into docs/benchmarks.md (long; stores cached in RMQ_BENCH_DIR; BENCH_ARGS=...)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-writers: $(BENCH_STAMP) ## The write phase through delta-rs and delta-spark on the 1m stores (BENCH_ARGS=--size 4m ...)
	$(BIN)/python -m bench.writers $(BENCH_ARGS)

bench-scaleout: $(BENCH_STAMP) ## Only the local[1] vs local[2] check on the 1M stores, into docs/benchmarks.md
	$(BIN)/python -m bench.scaleout

package: $(STAMP) ## Build dist/ (zip + entry script) for spark-submit and print the command
	rm -rf dist
	$(BIN)/python -m jobs.package dist

clean: ## Remove the sample store and outputs (keeps .venv)
	rm -rf sample dist
