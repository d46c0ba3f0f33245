# django-leases developer tasks. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/django_leases
MARIADB_URL ?= mysql://root@127.0.0.1:3306/django_leases
SQLITE_URL ?=
PYTEST_ARGS ?=

.PHONY: venv bytecode test test-sqlite test-postgres test-mariadb test-django6 test-psycopg2 \
	mariadb-timezones coverage-erase coverage-report lint docs docs-images demo bench bench-leases \
	bench-workflows bench-fairness bench-exactly bench-scale messages clean

# One venv, filled as far as the task needs: `make demo` installs the package (with the
# webhooks extra: the demo's trigger sources) and the demo's dependency group; `make test`,
# `lint` and `docs` add the test, lint and docs groups; the benchmarks add their peers. The
# groups are PEP 735 dependency groups in pyproject.toml, never published as extras: pip
# installs them with --group from 25.1 on, so each venv upgrades its pip first.
GROUPS_PIP := pip>=25.1

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade '$(GROUPS_PIP)'

$(VENV)/.demo-installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[webhooks]' --group demo
	touch $@

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[webhooks]' --group dev
	touch $@

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet --group bench
	touch $@

venv: $(VENV)/.installed

# The suite on every backend, each pass measured by coverage (branch), then one combined report
# that fails under the level in pyproject.toml ([tool.coverage.report] fail_under). The passes
# run at once, TEST_JOBS of them (1: one after another); each pass's output is printed whole
# when it ends. Each goes on to its end whatever another's outcome (-k).
TEST_PASSES ?= test-sqlite test-postgres test-mariadb test-psycopg2
TEST_JOBS ?= 4

test: coverage-erase bytecode $(VENV)/.docs-installed
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
	@$(PY) -m pip install --quiet -e '.[mysql,webhooks]' || { \
	  echo "mysqlclient could not be installed: it needs pkg-config and the MariaDB client" \
	    "headers (Debian: apt-get install pkg-config libmariadb-dev)" >&2; exit 1; }
	touch $@

# A database TIME_ZONE's clock (CONVERT_TZ; checks E021, W041) needs MariaDB's time zone
# tables; loaded once (an empty mysql.time_zone_name means they never were), with
# mysql_tzinfo_to_sql and the mysql client (Debian: mariadb-client, which the server
# package brings) as MARIADB_URL's user, who must be allowed to write the mysql schema
# (root is).
mariadb-timezones: venv
	@set -e; eval "$$($(PY) -c 'import shlex, sys; from urllib.parse import urlsplit; \
	u = urlsplit(sys.argv[1]); \
	print("host=%s port=%s user=%s pw=%s" % tuple(shlex.quote(str(v)) for v in \
	(u.hostname or "127.0.0.1", u.port or 3306, u.username or "root", u.password or "")))' \
	'$(MARIADB_URL)')"; \
	client="mysql --protocol=tcp -h $$host -P $$port -u $$user"; \
	if [ -n "$$pw" ]; then export MYSQL_PWD="$$pw"; fi; \
	count=$$($$client -N -e 'SELECT COUNT(*) FROM mysql.time_zone_name') || { \
	  echo "mariadb-timezones: cannot query MariaDB at $$host:$$port as $$user" >&2; exit 1; }; \
	if [ "$$count" = 0 ]; then \
	  echo "== loading MariaDB's time zone tables (mysql_tzinfo_to_sql /usr/share/zoneinfo)"; \
	  mysql_tzinfo_to_sql /usr/share/zoneinfo 2>/dev/null | $$client mysql; \
	fi

# A MariaDB that does not answer fails this pass (the test database cannot be created).
test-mariadb: $(VENV)/.mysql-installed mariadb-timezones
	@echo "== $@"
	DATABASE_URL='$(MARIADB_URL)' $(COVERAGE) run -m pytest $(PYTEST_ARGS)

# Django 6.x needs Python >= 3.12: a second venv, the SQLite suite on the newest Django 6.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
VENV6 ?= .venv-django6

$(VENV6)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "test-django6 needs Python 3.12 (set PYTHON312=...)"; exit 1; }
	$(PYTHON312) -m venv $(VENV6)
	$(VENV6)/bin/python -m pip install --quiet --upgrade '$(GROUPS_PIP)'
	$(VENV6)/bin/python -m pip install --quiet -e '.[webhooks]' --group dev --group docs 'Django>=6,<7'
	touch $@

# The Django 6 pass leaves out (DJANGO6_LEFT_TO_5_2) the tests that race, kill and stop
# worker processes, the hostile-HTTP run, the sweep that fails every statement of a run in
# turn, and the demo tour: they meet the operating system and the database through the code
# the rest of the suite runs on Django 6, and each costs a minute or more of CPU under CI's
# load; the Django 5.2 passes run them on every backend. DJANGO6_LEFT_TO_5_2= runs them all.
DJANGO6_LEFT_TO_5_2 ?= tests/test_demo_tour.py tests/test_workflow_chaos.py \
	tests/test_tasks_chaos.py tests/test_triggers_hostile.py tests/test_schedule_workers.py \
	tests/test_schedule_overlap_workers.py tests/test_statement_faults.py

test-django6: $(VENV6)/.installed
	@echo "== $@ (leaving $(words $(DJANGO6_LEFT_TO_5_2)) process-level files to Django 5.2)"
	$(VENV6)/bin/python -m compileall -q -j 0 $(COMPILED)
	DATABASE_URL='$(SQLITE_URL)' $(VENV6)/bin/python -m pytest -p no:cacheprovider $(PYTEST_ARGS) \
		$(addprefix --ignore=,$(DJANGO6_LEFT_TO_5_2))

# PostgreSQL through psycopg2 (Django's backend takes psycopg 3 whenever it is importable, so
# this venv has psycopg2-binary and no psycopg): the tests that meet the driver, not the whole
# suite (PSYCOPG2_TESTS; PSYCOPG2_TESTS=tests runs everything). They are the statements and
# cursors (db.py: the hot statements, the tuned SQL, bounded statements, the prepared-statement
# switch), the lease and workflow conformance suites, lease connections and races, step
# claims, the worker (polling instead of LISTEN/NOTIFY), waits, trigger deliveries (JSON into
# jsonb), the Tasks backend, the checks (I032), and killed or cut connections (lease timeouts,
# deferred renewals: psycopg2 reports a dead connection with other exceptions). About 570
# tests in 2.5 minutes, mostly waiting on the database. The rest of the suite is driver-blind
# (admin, commands' parsing, docs, SQLite/MariaDB-only tests) or covered on psycopg 3; a full
# psycopg2 run (PSYCOPG2_TESTS=tests, or a noxfile cell) passes too.
# Its own test database (DL_TEST_DB_SUFFIX), so it runs beside test-postgres.
VENVPG2 ?= .venv-psycopg2
PSYCOPG2_TESTS ?= tests/test_db.py tests/test_lease_conformance.py tests/test_lease_functions.py \
	tests/test_lease_connections.py tests/test_lease_races.py tests/test_lease_hot_paths.py \
	tests/test_step_claims.py tests/test_workflow_conformance.py tests/test_workflow_engine.py \
	tests/test_workflow_worker.py tests/test_waits_conformance.py tests/test_workflow_hot_path.py \
	tests/test_triggers_receiving.py tests/test_tasks.py tests/test_checks.py \
	tests/test_lease_timeouts.py tests/test_renewal_deferred.py tests/test_lease_dead_connections.py

$(VENVPG2)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENVPG2)
	$(VENVPG2)/bin/python -m pip install --quiet --upgrade '$(GROUPS_PIP)'
	$(VENVPG2)/bin/python -m pip install --quiet -e '.[webhooks]' --group test psycopg2-binary
	@! $(VENVPG2)/bin/python -c 'import psycopg' 2>/dev/null || { \
	  echo "$(VENVPG2) has psycopg 3: Django would not use psycopg2" >&2; exit 1; }
	touch $@

test-psycopg2: $(VENVPG2)/.installed
	@echo "== $@ (psycopg2: $(words $(PSYCOPG2_TESTS)) test files)"
	DATABASE_URL='$(PG_URL)' DL_TEST_DB_SUFFIX=_psycopg2 $(VENVPG2)/bin/python -m coverage run \
		-m pytest $(PYTEST_ARGS) $(PSYCOPG2_TESTS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy django_leases

# The catalogues (django_leases/locale/: German and French): every marked string extracted
# into each language's .po file (new ones untranslated, to be translated there), then compiled
# into the .mo files, which are committed. A new language: cd django_leases && django-admin
# makemessages -l <code>, once. Needs GNU gettext (Debian: apt-get install gettext).
messages: venv
	cd django_leases && ../$(VENV)/bin/django-admin makemessages --all --add-location file
	cd django_leases && ../$(VENV)/bin/django-admin compilemessages

# The docs site (MkDocs + Material) into site/; warnings are errors, as in CI.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet --group docs
	touch $@

docs: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs build --strict

demo: $(VENV)/.demo-installed
	$(PY) -m demo_project.tour

# `make bench` runs both benchmarks. BENCH_ARGS still goes to the lease benchmark;
# WORKFLOWS_BENCH_ARGS to the workflow one (e.g. "--repeat 1 --latency-samples 10").
LEASES_BENCH_ARGS ?= $(BENCH_ARGS)
WORKFLOWS_BENCH_ARGS ?=

bench: bench-leases bench-workflows bench-fairness bench-exactly

bench-leases: $(VENV)/.bench-installed
	$(PY) bench/leases.py $(LEASES_BENCH_ARGS)

# The cost of exactly once: transactional against plain steps writing one row (PostgreSQL).
EXACTLY_BENCH_ARGS ?=

bench-exactly: $(VENV)/.bench-installed
	$(PY) bench/exactly_once.py $(EXACTLY_BENCH_ARGS)

# The workflow benchmark runs every contender under one Python and one Django: django-ox needs
# Python >= 3.12 and Django 6, so it gets its own venv with django-leases (editable) and the peers.
VENVB ?= .venv-bench312

$(VENVB)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "bench-workflows needs Python 3.12 (set PYTHON312=...)"; exit 1; }
	$(PYTHON312) -m venv $(VENVB)
	$(VENVB)/bin/python -m pip install --quiet --upgrade '$(GROUPS_PIP)'
	$(VENVB)/bin/python -m pip install --quiet -e '.[webhooks]' --group bench 'Django>=6,<7'
	touch $@

bench-workflows: $(VENVB)/.installed
	$(VENVB)/bin/python bench/workflows.py $(WORKFLOWS_BENCH_ARGS)

# Per-key limits: a small key's wait behind a big key's backlog, ours beside DBOS Transact's
# partitioned queue, and the keyed claim's cost beside the plain claim (bench/fairness.py).
bench-fairness: $(VENVB)/.installed
	$(VENVB)/bin/python bench/fairness.py $(FAIRNESS_BENCH_ARGS)

# The scale stage alone: the 1,000-run drain on empty tables and on tables kept with a million
# finished runs (filled once into django_leases_bench_workflows_scale, kept between runs).
SCALE_BENCH_ARGS ?= --scale 1000000

bench-scale: $(VENVB)/.installed
	$(VENVB)/bin/python bench/workflows.py --only scale $(SCALE_BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VENV6) $(VENVB) $(VENVPG2) .nox dist site demo.sqlite3* .coverage .coverage.* .pytest_cache \
		.mypy_cache .ruff_cache
