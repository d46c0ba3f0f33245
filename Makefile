# django-leases developer tasks. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/django_leases
SQLITE_URL ?=
PYTEST_ARGS ?=

.PHONY: venv test test-sqlite test-postgres lint demo bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

test: test-sqlite test-postgres

test-sqlite: venv
	DATABASE_URL='$(SQLITE_URL)' $(PY) -m pytest $(PYTEST_ARGS)

test-postgres: venv
	DATABASE_URL='$(PG_URL)' $(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy django_leases

demo: venv
	$(PY) -m demo_project.tour

bench: venv
	$(PY) bench/leases.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) demo.sqlite3* .pytest_cache .mypy_cache .ruff_cache
