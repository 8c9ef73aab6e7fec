# weir — `make help` lists the targets.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ORDERS ?=
#: pytest processes of `make test` (pytest-xdist; an xdist_group runs whole in one of them): the integration tests
#: wait on workers and the broker much of the time. Measured on the 2 cores with the test brokers' JVM options below:
#: 2 processes kept 1.2 cores busy (the integration tests in 696 s), 3 kept 1.7 busy (every test but the chaos run in
#: 599 s); 3 with the JVM's default options for every broker was no faster than 2 (668 s against 680: the cores were
#: full). The chaos run goes last, alone, as it ran when the other tests were measured (beside the unit tests'
#: hypothesis runs it once took twice as long).
TEST_PROCESSES ?= 3
#: JVM options of the brokers a test starts for itself (tests/integration/local_broker.py reads this variable): C1 only
#: and the serial collector. Such a broker lives for a minute or three, where C2's compilations and G1's threads cost
#: more CPU than they save (the three-broker test: 181 CPU-seconds instead of 260). The shared broker keeps the JVM's
#: defaults: on C1 too, it slowed the chaos run that ends the suite from 56 s to 80 s.
export WEIR_TEST_KAFKA_JVM_OPTS ?= -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help install broker broker-stop broker-wipe demo demo-split demo-eof chaos chaos-faults test test-unit test-integration lint format bench clean compose-check

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "Python 3.11+ is required (python3 not found)"; exit 1; }
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { echo "Python 3.11+ is required, found $$($(PY) --version)"; exit 1; }
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install weir with its dev tools
	@scripts/broker.sh jars

broker: $(STAMP) ## start the local Apache Kafka (KRaft, 127.0.0.1:19092); KAFKA_BOOTSTRAP=host:port uses another
	scripts/broker.sh start

broker-stop: ## stop the local Apache Kafka
	scripts/broker.sh stop

broker-wipe: ## stop the local Apache Kafka and delete its data
	scripts/broker.sh wipe

demo: $(STAMP) ## run the ice-cream shop on demo/shop/*.jsonl, one screen per file (ORDERS=folder to use yours)
	@if scripts/broker.sh status >/dev/null 2>&1 || [ -n "$$KAFKA_BOOTSTRAP" ]; then started=no; else started=yes; fi; \
	scripts/broker.sh start || exit 1; \
	$(BIN)/python -m shop.demo $(if $(ORDERS),--orders $(ORDERS),); rc=$$?; \
	if [ $$started = yes ]; then scripts/broker.sh stop; fi; exit $$rc

demo-split: $(STAMP) ## run the split/aggregate pipeline on demo/orders.jsonl (ORDERS=file to use yours)
	@if scripts/broker.sh status >/dev/null 2>&1 || [ -n "$$KAFKA_BOOTSTRAP" ]; then started=no; else started=yes; fi; \
	scripts/broker.sh start || exit 1; \
	$(BIN)/python -m examples.split_aggregate $(if $(ORDERS),--orders $(ORDERS),); rc=$$?; \
	if [ $$started = yes ]; then scripts/broker.sh stop; fi; exit $$rc

demo-eof: $(STAMP) ## seed 000's deployment: two end-of-stream tasks at once on shared stages, both reports per client
	@if scripts/broker.sh status >/dev/null 2>&1 || [ -n "$$KAFKA_BOOTSTRAP" ]; then started=no; else started=yes; fi; \
	scripts/broker.sh start || exit 1; \
	$(BIN)/python -m examples.eof_tasks; rc=$$?; \
	if [ $$started = yes ]; then scripts/broker.sh stop; fi; exit $$rc

lint: $(STAMP) ## ruff check, ruff format --check, mypy --strict on weir (weir, app, agents, tables), the shop and the examples
	$(BIN)/ruff check weir app agents tables shop examples tests bench scripts
	$(BIN)/ruff format --check weir app agents tables shop examples tests bench scripts
	$(BIN)/mypy

format: $(STAMP) ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix weir app agents tables shop examples tests bench scripts
	$(BIN)/ruff format weir app agents tables shop examples tests bench scripts

test-unit: $(STAMP) ## unit and property tests (no broker)
	$(BIN)/pytest tests/unit

test-integration: $(STAMP) ## end-to-end tests on the real broker with real faust workers
	scripts/chromium.sh >/dev/null   # the web tests drive a real headless Chromium (installs Debian's package as root)
	scripts/broker.sh start
	$(BIN)/pytest tests/integration

test: $(STAMP) ## lint, then every test (starts the local broker itself, and stops it after if it started it)
	$(MAKE) --no-print-directory lint
	scripts/chromium.sh >/dev/null   # the web tests drive a real headless Chromium (installs Debian's package as root)
	@if scripts/broker.sh status >/dev/null 2>&1 || [ -n "$$KAFKA_BOOTSTRAP" ]; then started=no; else started=yes; fi; \
	if scripts/postgres.sh status >/dev/null 2>&1 || [ -n "$$DATABASE_URL" ]; then pg_started=no; else pg_started=yes; fi; \
	scripts/broker.sh start || exit 1; \
	scripts/postgres.sh start >/dev/null; pg=$$?; if [ $$pg = 1 ]; then exit 1; fi; \
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadgroup --durations=15 --deselect tests/integration/test_chaos.py tests; rc=$$?; \
	$(BIN)/pytest --durations=1 tests/integration/test_chaos.py || rc=1; \
	if [ $$pg_started = yes ] && [ $$pg = 0 ]; then scripts/postgres.sh stop >/dev/null; fi; \
	if [ $$started = yes ]; then scripts/broker.sh stop; fi; exit $$rc

BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) ## side by side: raw aiokafka, plain Faust, weir, Quix Streams, Kafka Streams (bench/results.md and .json, charts in bench/charts/; QUICK=1 = 1-run smoke), then the barrier, one hop's floor and the shop under load
	scripts/broker.sh start
	$(BIN)/python -m bench.compare $(if $(QUICK),--quick,)
	$(BIN)/python -m bench.charts bench/results.json --out bench/charts
	$(BIN)/python -m bench.barrier
	$(BIN)/python -m bench.hop
	$(BIN)/python -m bench.shop_load

chaos: $(STAMP) ## long shop runs: a worker of every stage SIGKILLed in turn with bad inputs (ORDERS_N=2000 KILL_EVERY=5 VICTIMS=all), then the broker faults' long forms (FAULT_ORDERS=600)
	scripts/broker.sh start
	$(BIN)/python -m bench.chaos --orders $(or $(ORDERS_N),2000) --kill-every $(or $(KILL_EVERY),5) --victims $(or $(VICTIMS),all)
	$(MAKE) --no-print-directory chaos-faults

chaos-faults: $(STAMP) ## the broker faults' long forms: the broker SIGKILLed, a 3-node cluster's nodes SIGKILLed in turn, network faults (FAULT_ORDERS=600)
	scripts/broker.sh start
	SHOP_FAULT_ORDERS=$(or $(FAULT_ORDERS),600) SHOP_CLUSTER_ORDERS=$(or $(FAULT_ORDERS),600) $(BIN)/pytest -s \
	    tests/integration/test_broker_kill_shop.py tests/integration/test_cluster.py tests/integration/test_network_faults.py

compose-check: $(STAMP) ## parse docker/compose.yaml without a Docker engine
	$(BIN)/python scripts/check_compose.py docker/compose.yaml

clean: ## remove the venv and local state (broker data, tables)
	-scripts/broker.sh stop
	rm -rf $(VENV) .weir .pytest_cache .mypy_cache .ruff_cache .hypothesis
