# django-leases developer tasks. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/django_leases
MARIADB_URL ?= mysql://root@127.0.0.1:3306/django_leases
SQLITE_URL ?=
PYTEST_ARGS ?=

.PHONY: venv bytecode test test-sqlite test-postgres test-mariadb test-django6 coverage-erase \
	coverage-report lint docs docs-images demo bench bench-leases bench-workflows bench-scale \
	clean

# One venv, filled as far as the task needs: `make demo` installs the package and the one
# library the demo's settings read the environment with; `make test`, `lint` and `docs` add
# the test, lint and docs tools; the benchmarks add their peers.
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[demo,webhooks]'
	touch $@

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[demo,dev,webhooks]'
	touch $@

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

venv: $(VENV)/.installed

# The suite on every backend, each pass measured by coverage (branch), then one combined report
# that fails under the level in pyproject.toml ([tool.coverage.report] fail_under). The passes
# run at once, TEST_JOBS of them (1: one after another); each pass's output is printed whole
# when it ends. Each goes on to its end whatever another's outcome (-k).
TEST_PASSES ?= test-sqlite test-postgres test-mariadb
TEST_JOBS ?= 3

test: coverage-erase bytecode
	@echo "== $(TEST_PASSES), $(TEST_JOBS) at once; each pass's output follows when it ends"
	@$(MAKE) --no-print-directory -k -j$(TEST_JOBS) --output-sync=target $(TEST_PASSES)
	@$(MAKE) --no-print-directory coverage-report

# The suite starts hundreds of Python processes (manage.py commands, workers, the tour). Where
# PYTHONDONTWRITEBYTECODE is set, each would compile the project's modules anew (half the CPU
# of its start): compile them once (test-django6 does it for its own interpreter).
COMPILED := django_leases demo_project tests manage.py

bytecode: venv
	$(PY) -m compileall -q -j 0 $(COMPILED)

COVERAGE := $(PY) -m coverage

coverage-erase: venv
	$(COVERAGE) erase

coverage-report: venv
	$(COVERAGE) combine --quiet
	$(COVERAGE) report

test-sqlite: venv
	@echo "== $@"
	DATABASE_URL='$(SQLITE_URL)' $(COVERAGE) run -m pytest $(PYTEST_ARGS)

test-postgres: venv
	@echo "== $@"
	DATABASE_URL='$(PG_URL)' $(COVERAGE) run -m pytest $(PYTEST_ARGS)

# The admin screenshots in docs/img/ come from the browser tests (Debian's chromium).
docs-images: venv
	DL_DOCS_IMAGES=1 DATABASE_URL='$(SQLITE_URL)' $(PY) -m pytest tests/browser -p no:cacheprovider

# mysqlclient builds from source: it needs pkg-config and the MariaDB (or MySQL) client
# library's headers (Debian: apt-get install pkg-config libmariadb-dev; .ci/run does it).
$(VENV)/.mysql-installed: $(VENV)/.installed pyproject.toml
	@$(PY) -m pip install --quiet -e '.[mysql]' || { \
	  echo "mysqlclient could not be installed: it needs pkg-config and the MariaDB client" \
	    "headers (Debian: apt-get install pkg-config libmariadb-dev)" >&2; exit 1; }
	touch $@

# A MariaDB that does not answer fails this pass (the test database cannot be created).
test-mariadb: $(VENV)/.mysql-installed
	@echo "== $@"
	DATABASE_URL='$(MARIADB_URL)' $(COVERAGE) run -m pytest $(PYTEST_ARGS)

# Django 6.x needs Python >= 3.12: a second venv, the SQLite suite on the newest Django 6.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
VENV6 ?= .venv-django6

$(VENV6)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "test-django6 needs Python 3.12 (set PYTHON312=...)"; exit 1; }
	$(PYTHON312) -m venv $(VENV6)
	$(VENV6)/bin/python -m pip install --quiet --upgrade pip
	$(VENV6)/bin/python -m pip install --quiet -e '.[dev,webhooks]' 'Django>=6,<7'
	touch $@

test-django6: $(VENV6)/.installed
	@echo "== $@"
	$(VENV6)/bin/python -m compileall -q -j 0 $(COMPILED)
	DATABASE_URL='$(SQLITE_URL)' $(VENV6)/bin/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy django_leases

# The docs site (MkDocs + Material) into site/; warnings are errors, as in CI.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs build --strict

demo: $(VENV)/.demo-installed
	$(PY) -m demo_project.tour

# `make bench` runs both benchmarks. BENCH_ARGS still goes to the lease benchmark;
# WORKFLOWS_BENCH_ARGS to the workflow one (e.g. "--repeat 1 --latency-samples 10").
LEASES_BENCH_ARGS ?= $(BENCH_ARGS)
WORKFLOWS_BENCH_ARGS ?=

bench: bench-leases bench-workflows

bench-leases: $(VENV)/.bench-installed
	$(PY) bench/leases.py $(LEASES_BENCH_ARGS)

# The workflow benchmark runs every contender under one Python and one Django: django-ox needs
# Python >= 3.12 and Django 6, so it gets its own venv with django-leases (editable) and the peers.
VENVB ?= .venv-bench312

$(VENVB)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "bench-workflows needs Python 3.12 (set PYTHON312=...)"; exit 1; }
	$(PYTHON312) -m venv $(VENVB)
	$(VENVB)/bin/python -m pip install --quiet --upgrade pip
	$(VENVB)/bin/python -m pip install --quiet -e '.[bench,webhooks]' 'Django>=6,<7'
	touch $@

bench-workflows: $(VENVB)/.installed
	$(VENVB)/bin/python bench/workflows.py $(WORKFLOWS_BENCH_ARGS)

# The scale stage alone: the 1,000-run drain on empty tables and on tables kept with a million
# finished runs (filled once into django_leases_bench_workflows_scale, kept between runs).
SCALE_BENCH_ARGS ?= --scale 1000000

bench-scale: $(VENVB)/.installed
	$(VENVB)/bin/python bench/workflows.py --only scale $(SCALE_BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VENV6) $(VENVB) site demo.sqlite3* .coverage .coverage.* .pytest_cache \
		.mypy_cache .ruff_cache
