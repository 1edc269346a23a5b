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
.PHONY: help run test test-runs test-notebook test-airflow report lint format clean package venv bench bench-scaleout bench-small bench-schedule test-broker test-broker-harness test-cluster test-connect test-broker-compare fuzz bench-writers test-delta test-processes test-prepare

# The variables a target's text may name as $(NAME): `make help` shows their values.
HELP_VARS := SAMPLE_STORE SAMPLE_OUTPUT SAMPLE_TRANSACTIONS BROKER_RUNS DIST

help: ## Show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' \
		-v vars='$(foreach v,$(HELP_VARS),$(v)=$($(v)))' \
		'BEGIN {n = split(vars, kv, " "); for (i = 1; i <= n; i++) {split(kv[i], p, "="); value["$$(" p[1] ")"] = p[2]}} \
		{t = $$2; for (k in value) while ((j = index(t, k)) > 0) t = substr(t, 1, j - 1) value[k] substr(t, j + length(k)); \
		name[NR] = $$1; text[NR] = t; if (length($$1) > w) w = length($$1)} \
		END {for (i = 1; i <= NR; i++) printf "  make %-*s  %s\n", w, name[i], text[i]}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## Create .venv and install the project with its dev tools

# The sample store is simulated again when SAMPLE_TRANSACTIONS changes: the stamp names
# the size it was simulated with.
SAMPLE_STAMP := $(SAMPLE_STORE)/.simulated-$(SAMPLE_TRANSACTIONS)-transactions

$(SAMPLE_STAMP): | $(STAMP)
	rm -rf $(SAMPLE_STORE)
	$(BIN)/python -m simulator --out $(SAMPLE_STORE) --transactions $(SAMPLE_TRANSACTIONS) --seed 7
	touch $@

run: $(STAMP) $(SAMPLE_STAMP) ## Simulate a sample broker store (again when SAMPLE_TRANSACTIONS changes), reconcile it, print the summary
	$(BIN)/python -m jobs.reconcile --store $(SAMPLE_STORE) --as-of latest --output $(SAMPLE_OUTPUT)
	$(BIN)/python -m jobs.report --output $(SAMPLE_OUTPUT)

test: $(STAMP) ## Run the test suite: transforms, readers, writers, properties and worked cases (~10 min)
	$(BIN)/python -m pytest

test-runs: $(STAMP) ## Whole runs of the job in one session: the command line, the real-broker fixtures, bad input (~20 min)
	$(BIN)/python -m pytest -m runs

test-processes: $(STAMP) ## Real processes: a kill after each table, Ctrl-C and SIGTERM, two runs on one root, the printed spark-submit command, the README snippet, every runnable command block of README and docs/
	$(BIN)/python -m pytest -m 'faults or processes' tests/robustness/test_faults.py tests/jobs/test_package.py tests/jobs/test_front_door.py tests/jobs/test_interrupt.py tests/repo/test_docs_commands.py

# Issue 10, real RocketMQ brokers. The harness half: build harness/rocketmq/v5 (5.3.3) and v4
# (4.9.7) with Maven (dependencies cached in ~/.m2; needs Maven Central once, JDK 17) and run each
# line in-process (12 rounds, 500 transactions, <= 7 min each) into BROKER_RUNS/<version>/.
# A harness that cannot start fails here with one `error: ...` line. The comparison half,
# `test-broker-compare` (branch issue-10b), then compares every round of those runs.
BROKER_RUNS ?= $(abspath build/broker-runs)
test-broker-harness: ## Build and run the real-broker harness, both version lines, into BROKER_RUNS
	bash harness/rocketmq/run-all.sh $(BROKER_RUNS)

test-broker: test-broker-harness $(STAMP) ## Real brokers: run the harness, then compare every round (slow; Maven Central)
	$(MAKE) test-broker-compare RUN=$(BROKER_RUNS)

# The Python half of `make test-broker` (issue 10): compare every round of a real-broker run
# directory (the harness's output, RUN=<dir>: one run, or a directory of runs) with our
# simulator and with the job, then print the one summary line last.
BROKER_RESULTS ?= $(abspath .pytest_cache/broker-results.jsonl)
test-broker-compare: $(STAMP) ## Compare a real-broker harness run with the simulator and the job (RUN=<dir>)
	@test -n "$(RUN)" || { echo "error: give RUN=<harness run directory>" >&2; exit 2; }
	@test -d "$(RUN)" || { echo "error: RUN=$(RUN): no such directory" >&2; exit 2; }
	RMQ_BROKER_RUN="$(abspath $(RUN))" RMQ_BROKER_RESULTS="$(BROKER_RESULTS)" \
	  timeout 3600 $(BIN)/python -m pytest -m 'runs or not runs' tests/broker/test_real_rounds.py tests/broker/test_real_tables.py tests/broker/test_real_bytes.py -k 'run:'; \
	  rc=$$?; $(BIN)/python -m tests.broker.summary "$(BROKER_RESULTS)" || rc=1; exit $$rc

test-delta: $(STAMP) ## delta-spark tests in a session with Delta's jars (first run fetches them into ~/.cache/rmq-txn-reconcile/ivy)
	$(BIN)/python -m pytest -m delta tests/delta

test-notebook: $(STAMP) ## Execute examples/audit.ipynb top to bottom
	$(BIN)/python -m pytest -m notebook tests/report/test_notebook.py

# On a fresh machine the slow suites first download what they run on: .ci/run starts this
# beside lint and `make test` (it mostly waits on the network). Quick once everything is cached.
test-prepare: $(STAMP) ## Fetch what the slow suites run on: the Airflow venv, the cluster's executor venv, Delta's jars
	bash tests/airflow/run.sh --venv-only
	PYTHONDONTWRITEBYTECODE=1 $(BIN)/python -m tests.cluster.executor_venv
	$(BIN)/python -c "from jobs.session import build_session; build_session(master='local[1]', delta=True).stop()"

test-airflow: ## Airflow DAG test in its own venv (~/.cache/rmq-txn-reconcile/venv-airflow)
	bash tests/airflow/run.sh

# The venv's own __pycache__ writes stay out of the checkout: the test asserts it is unchanged.
test-cluster: $(STAMP) ## Standalone master + 2 workers on loopback: packaged job vs local[2] (~12 min)
	@start=$$(date +%s); \
	PYTHONDONTWRITEBYTECODE=1 $(BIN)/python -m pytest -m cluster -s -p no:cacheprovider tests/cluster; \
	status=$$?; echo "make test-cluster: exit $$status in $$(( $$(date +%s) - start )) s"; exit $$status

# A Spark Connect server of the venv's pyspark on loopback (tests/connect/server.py starts and
# stops it, also on failure): the command line and the notebook functions through it vs local[2].
test-connect: $(STAMP) ## Spark Connect server on loopback: the job and the notebook functions through it vs local[2] (~10 min)
	@start=$$(date +%s); \
	PYTHONDONTWRITEBYTECODE=1 $(BIN)/python -m pytest -m connect -s -p no:cacheprovider tests/connect; \
	status=$$?; echo "make test-connect: exit $$status in $$(( $$(date +%s) - start )) s"; exit $$status

report: $(STAMP) ## Write the HTML report of the newest run in $(SAMPLE_OUTPUT) and print its path
	$(BIN)/python -m jobs.report --output $(SAMPLE_OUTPUT)

lint: $(STAMP) ## ruff (style, complexity, types of public functions), format, mypy, duplicate code, function length
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pylint --score=n jobs transforms schemas connectors
	$(BIN)/python -m checks.function_length

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

BENCH_STAMP := $(VENV)/.bench-stamp
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) ## Benchmark: sample pairs vs bare Spark, 1M/4M/16M x3 with bare Spark and the DuckDB peer, scale-out, into docs/benchmarks.md (~1 h; stores cached in RMQ_BENCH_DIR; BENCH_ARGS=...)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-small: $(BENCH_STAMP) ## Quick: the job vs bare Spark on the make-run sample (3 interleaved pairs, each also via a warm Spark Connect server) and 1m, with load and Spark job counts (BENCH_ARGS=--skip-1m --skip-connect ...)
	$(BIN)/python -m bench.small $(BENCH_ARGS)

bench-schedule: $(BENCH_STAMP) ## Scheduled runs through the mirror: first run, the next after 5 min of traffic, a whole read, bare Spark and the DuckDB peer on the 1m stores, with the scheduled-run targets (BENCH_ARGS=--size 16m ...)
	$(BIN)/python -m bench.schedule $(BENCH_ARGS)

bench-writers: $(BENCH_STAMP) ## The write phase through delta-rs and delta-spark on the 1m stores (BENCH_ARGS=--size 4m ...)
	$(BIN)/python -m bench.writers $(BENCH_ARGS)

bench-scaleout: $(BENCH_STAMP) ## Only the local[1] vs local[2] check on the 1M stores, into docs/benchmarks.md
	$(BIN)/python -m bench.scaleout

FUZZ_STAMP := $(VENV)/.fuzz-stamp
FUZZ_SECONDS ?= 300
FUZZ_DIR ?= $(HOME)/.cache/rmq-txn-reconcile/fuzz

$(FUZZ_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,fuzz]'
	touch $(FUZZ_STAMP)

fuzz: $(FUZZ_STAMP) ## Coverage-guided fuzzing of the store decoder with atheris (manual, not in CI; FUZZ_SECONDS=300)
	$(BIN)/python fuzz/fuzz_reader.py --write-seeds $(FUZZ_DIR)/seeds
	mkdir -p $(FUZZ_DIR)/corpus $(FUZZ_DIR)/findings
	$(BIN)/python fuzz/fuzz_reader.py $(FUZZ_DIR)/corpus $(FUZZ_DIR)/seeds -max_total_time=$(FUZZ_SECONDS) \
		-max_len=20000 -timeout=30 -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/findings/

DIST ?= dist

package: $(STAMP) ## Build dist/ (or DIST=DIR): zip + entry script for spark-submit, print the command
	rm -rf $(DIST)
	$(BIN)/python -m jobs.package $(DIST)

clean: ## Remove the sample store and outputs (keeps .venv)
	rm -rf sample dist
