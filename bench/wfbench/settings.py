"""Settings for the workflow benchmark's harness and its worker processes.

Every contender runs in this one project: the same Django, the same database
(``BENCH_DATABASE_URL``), the same connection settings: persistent connections
(``CONN_MAX_AGE=None``; ``BENCH_CONN_MAX_AGE`` changes it for every process), Django's default
client-side binding, ``DEBUG=False``. Each process
names its connection with ``BENCH_APPLICATION_NAME`` so the harness can find the PostgreSQL
backends serving a worker (their CPU is part of the cost of a task). ``BENCH_COUNT_STATEMENTS``
(a file path) makes the process count what it sends to PostgreSQL (see :mod:`wfbench.counting`).
"""

from __future__ import annotations

import os

from demo_project.settings import database_from_url

DATABASE_URL = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_leases_bench_workflows"
)

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_leases",
    "django_ox",
    "django_tasks_db",
    "procrastinate.contrib.django",
    "wfbench",
]

_database = database_from_url(DATABASE_URL)
# BENCH_CONN_MAX_AGE: seconds, or "none" (persistent connections, the default); "0" is
# Django's own default (a new connection per request, or per unit of work in a worker).
_conn_max_age = os.environ.get("BENCH_CONN_MAX_AGE", "none").strip().lower()
_database["CONN_MAX_AGE"] = None if _conn_max_age in ("", "none") else float(_conn_max_age)
_database.setdefault("OPTIONS", {})["application_name"] = os.environ.get(
    "BENCH_APPLICATION_NAME", "wfbench"
)
DATABASES = {"default": _database}

# Three django.tasks backends side by side: django-ox on "default", django-tasks-db on "db",
# django-leases' TaskBackend on "leases" (each with its defaults).
TASKS = {
    "default": {"BACKEND": "django_ox.backend.OxBackend"},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "leases": {"BACKEND": "django_leases.tasks.TaskBackend"},
}

LOGGING_CONFIG = None

if os.environ.get("BENCH_COUNT_STATEMENTS"):
    from wfbench.counting import install

    install(os.environ["BENCH_COUNT_STATEMENTS"])
