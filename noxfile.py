"""The compatibility matrix: Python x Django x database (x PostgreSQL driver).

    .venv/bin/nox -l                     # every cell; [ci] marks the ones .ci/run runs
    .venv/bin/nox -s "tests(python='3.13', django='6.0', db='postgres', driver='psycopg3')"
    .venv/bin/nox -s "tests(python='3.12', django='6.1', db='mariadb', driver='')" \
        -- tests/test_lease_conformance.py
    .venv/bin/nox -t ci -- ci            # the CI cells (CI_CELLS) on CI_TESTS, as .ci/run

Each cell is a fresh venv of that Python with the package (``.[webhooks]``), the ``test``
dependency group, that Django and that database's driver, then pytest on it: the whole suite,
or the files given after ``--``. The databases are the ones ``make test`` uses (``PG_URL``,
``MARIADB_URL``); each cell's test database carries the cell's name (``DL_TEST_DB_SUFFIX``),
so cells may run at once. MariaDB's time zone tables are loaded by ``make mariadb-timezones``
(``.ci/run`` does it first).

The Pythons are found on ``PATH`` and in pyenv's versions (``~/.pyenv/versions/3.X*/bin``);
a Python that is not there is not in the matrix (3.14 joins where it is installed). Django 6.0
and 6.1 need Python >= 3.12, so 3.11 only meets Django 5.2.

``.ci/run`` runs ``make test`` (Python 3.11 and Django 5.2 on SQLite, PostgreSQL with
psycopg 3 and with psycopg2, and MariaDB: the whole suite but for the psycopg2 subset;
Python 3.12 and Django 6.1 on SQLite: the suite but for the process-level chaos, the
statement-fault sweep and the demo tour, ``DJANGO6_LEFT_TO_5_2`` in the Makefile) and then
the cells tagged ``ci`` (:data:`CI_CELLS`) on :data:`CI_TESTS`, so every Python, every Django
and every database of the matrix runs in CI within its time budget. The rest of the matrix is
for release time: ``nox`` runs it all.
"""

from __future__ import annotations

import glob
import os
import shutil

import nox

nox.options.default_venv_backend = "venv"
# A missing Python skips its cells on a developer's machine and fails them under CI=true
# (nox's default), so CI never passes without a cell it was meant to run.
nox.options.sessions = ["tests"]

#: pyenv's interpreters, where pyenv keeps them, found by name like any other.
_PYENV = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin")), reverse=True)
os.environ["PATH"] = os.pathsep.join([*_PYENV, os.environ.get("PATH", "")])

#: The Pythons the project supports; a later one is added where it is installed.
SUPPORTED_PYTHONS = ["3.11", "3.12", "3.13"]
PYTHONS = [*SUPPORTED_PYTHONS, *(["3.14"] if shutil.which("python3.14") else [])]

#: Django series -> the requirement that installs it.
DJANGOS = {"5.2": "Django>=5.2,<5.3", "6.0": "Django>=6.0,<6.1", "6.1": "Django>=6.1,<6.2"}
#: The oldest Python each Django series runs on.
DJANGO_MIN_PYTHON = {"5.2": (3, 10), "6.0": (3, 12), "6.1": (3, 12)}

DATABASES = ("sqlite", "postgres", "mariadb")
#: PostgreSQL driver -> what installs it. Django takes psycopg 3 whenever it is importable,
#: so a psycopg2 cell has no psycopg at all.
DRIVERS = {"psycopg3": "psycopg[binary]>=3.1.12", "psycopg2": "psycopg2-binary>=2.9.9"}

PG_URL = os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432/django_leases")
MARIADB_URL = os.environ.get("MARIADB_URL", "mysql://root@127.0.0.1:3306/django_leases")

#: The cells .ci/run adds to ``make test``, as (python, django, database, driver): each
#: Python and Django series that ``make test`` does not run, on a database it did not pair
#: them with. With ``make test`` they make every Python (3.11-3.13), every Django (5.2, 6.0,
#: 6.1), every database and both drivers run in CI.
CI_CELLS = {
    ("3.13", "6.0", "postgres", "psycopg3"),
    ("3.13", "6.1", "mariadb", ""),
    ("3.12", "6.0", "sqlite", ""),
    ("3.13", "5.2", "postgres", "psycopg2"),
}

#: What a CI cell runs (``.ci/run`` passes it after ``--``): the conformance suites users run
#: on their own database, migrations, checks, the Tasks backend, the commands, and the
#: packaging test (the wheel built, installed in a new venv of the cell's Python and Django,
#: and used by a new project).
CI_TESTS = [
    "tests/test_lease_conformance.py",
    "tests/test_workflow_conformance.py",
    "tests/test_waits_conformance.py",
    "tests/test_triggers_conformance.py",
    "tests/test_migrations.py",
    "tests/test_checks.py",
    "tests/test_db.py",
    "tests/test_tasks.py",
    "tests/test_workflow_commands.py",
    "tests/test_portability.py",
    "tests/test_release.py",
    "tests/test_packaging.py",
]


def _version(python: str) -> tuple[int, int]:
    major, minor = python.split(".")[:2]
    return int(major), int(minor)


def _cells() -> list[object]:
    cells: list[object] = []
    for python in PYTHONS:
        for django in DJANGOS:
            if _version(python) < DJANGO_MIN_PYTHON[django]:
                continue
            for database in DATABASES:
                for driver in list(DRIVERS) if database == "postgres" else [""]:
                    ci = (python, django, database, driver) in CI_CELLS
                    cells.append(
                        nox.param(python, django, database, driver, tags=["ci"] if ci else [])
                    )
    return cells


def _database_url(database: str) -> str:
    return {"sqlite": "", "postgres": PG_URL, "mariadb": MARIADB_URL}[database]


@nox.session
@nox.parametrize(["python", "django", "db", "driver"], _cells())
def tests(session: nox.Session, django: str, db: str, driver: str) -> None:
    """One cell: the suite, or the files after ``--``."""
    session.install("--upgrade", "pip>=25.1")  # --group needs pip 25.1
    extras = "webhooks,mysql" if db == "mariadb" else "webhooks"
    needs = [DJANGOS[django], *([DRIVERS[driver]] if driver else [])]
    session.install("-e", f".[{extras}]", "--group", "test", *needs)
    imports = "import django, sys; print('Python', sys.version.split()[0], 'Django', "
    imports += "django.get_version())"
    if driver == "psycopg2":  # Django would take psycopg 3 if anything had brought it along
        imports += "; import importlib.util as u; assert u.find_spec('psycopg') is None"
    session.run("python", "-c", imports)
    suffix = "".join(c if c.isalnum() else "_" for c in f"_{session.python}_{django}_{driver}")
    env = {"DATABASE_URL": _database_url(db), "DL_TEST_DB_SUFFIX": suffix}
    targets = list(session.posargs) or ["tests"]
    if targets == ["ci"]:  # what .ci/run gives its cells: CI_TESTS, the packaging test in
        targets = CI_TESTS
        env["DL_PACKAGING_TEST"] = "1"
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *targets, env=env)
