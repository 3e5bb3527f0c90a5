# Conveyor: `make demo` runs the embedded demo job, `make test` runs the tests.
# Both create a virtualenv in .venv and install what they need into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# the demo's TPC-H scale factor (0.1 = 150,000 orders) and where its files go
SF ?= 0.1
DEMO_DIR ?= demo-data
PYTEST_ARGS ?=
# make test runs the suite in this many pytest-xdist workers, a module to a worker (each worker starts its own
# throwaway servers and Ray instances); 1 runs it in one process
TEST_WORKERS ?= 2

# the benchmark's TPC-H scale factor and what it runs (see benchmarks/bench.py --help)
BENCH_SF ?= 1
BENCH_ARGS ?= --tables orders --degrees 1,2,4 --repeat 3

.PHONY: demo test quick corpus docs bench bench-scale install clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	  echo "error: $(PYTHON) with venv and ensurepip (Python >= 3.10) is needed to make .venv" >&2; \
	  echo "hint: on Debian/Ubuntu: apt-get install python3 python3-venv (and make); or PYTHON=/path/to/python3.11 make ..." >&2; \
	  exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# constraints.txt: the versions of every package the tests ran with, as one set (pip's resolver backtracked for minutes, or
# gave up, over moto's, s3fs's and pyiceberg's dependencies without it); make it again with `pip freeze` after an upgrade
$(VENV)/.installed-%: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) install --quiet -e ".[$*]" -c constraints.txt
	@# an editable install leaves conveyor's own modules uncompiled: with PYTHONDONTWRITEBYTECODE set (as on CI images)
	@# every conveyor process compiled ~90 of them again at start (0.3-0.8 s here; the suite starts hundreds)
	$(BIN)/python -m compileall -q conveyor
	touch $@

install: $(VENV)/.installed-demo

demo: $(VENV)/.installed-demo
	$(BIN)/tpchgen-cli parquet -s $(SF) --tables=orders --parts=4 --output-dir=$(DEMO_DIR) --overwrite
	$(BIN)/conveyor run pipeline=demo source.path=$(DEMO_DIR)/orders sink.database=$(DEMO_DIR)/demo.duckdb

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-mariadb.sh
	bash scripts/ensure-clickhouse.sh
	$(BIN)/python -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# the tests that need no server, no Ray and no subprocess of the CLI (unit tests, files, DuckDB, SQLite): under two minutes
quick: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow and not servers" $(PYTEST_ARGS)

# the corpus test through the other targets, and column by column on every path (a refused column left out, the rest
# tried again): ~6 minutes
corpus: $(VENV)/.installed-test
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-mariadb.sh
	bash scripts/ensure-clickhouse.sh
	CONVEYOR_CORPUS_DEEP=1 $(BIN)/python -m pytest tests/integration/test_corpus.py -rA $(PYTEST_ARGS)

# the site on http://127.0.0.1:8000 (the docs extra alone: mkdocs and what the plugins' reference pages import)
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

bench: $(VENV)/.installed-bench
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-mariadb.sh
	bash scripts/ensure-clickhouse.sh
	$(BIN)/python benchmarks/bench.py --sf $(BENCH_SF) $(BENCH_ARGS)
	$(BIN)/python benchmarks/sync_bench.py --sf $(BENCH_SF)
	$(BIN)/python benchmarks/mysql_sync_bench.py --sf $(BENCH_SF)
	$(BIN)/python benchmarks/ch_sync_bench.py --sf $(BENCH_SF)
	$(BIN)/python benchmarks/migrate_bench.py --sf $(BENCH_SF)
	$(BIN)/python benchmarks/many_tables_bench.py

# how cost grows with size: lineitem at SF1 and SF$(BENCH_SCALE_SF) (SF10: 60 M rows, about 25 GB of disk and 25-40 minutes here)
BENCH_SCALE_SF ?= 10
bench-scale: $(VENV)/.installed-bench
	bash scripts/ensure-postgres.sh
	$(BIN)/python benchmarks/scale_bench.py --sfs 1,$(BENCH_SCALE_SF) $(BENCH_SCALE_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) outputs multirun .pytest_cache build .site *.egg-info
