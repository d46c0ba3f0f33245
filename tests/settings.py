"""Test settings: the demo project's, on the database named by ``DATABASE_URL``.

``make test`` runs the suite three times: SQLite (a file, so threads and processes share it),
PostgreSQL (``postgres://postgres@127.0.0.1:5432/django_leases``) and MariaDB
(``mysql://root@127.0.0.1:3306/django_leases``).
"""

import os
import tempfile
from importlib.util import find_spec

from demo_project.settings import *  # noqa: F403
from demo_project.settings import DJANGO_LEASES, INSTALLED_APPS, database_from_url, env

# The queues tests/test_workflow_queues.py declares step functions on (every process of the
# suite sees them: a forked worker, and the system checks).
DJANGO_LEASES = {
    **DJANGO_LEASES,
    # Not the demo's per-second `demo-tick` schedule: every worker a test runs would fire it.
    "SCHEDULES": {},
    "QUEUES": {
        "tests-mail": {},
        "tests-other": {},
        "tests-limited": {"concurrency": 3},
        "tests-one": {"concurrency": 1},
        "tests-rated": {"rate": "20/s"},
    },
}

# Nor a prune schedule (DJANGO_LEASES["PRUNE"]), should the demo set one: tests that need one
# set it themselves.
DJANGO_LEASES.pop("PRUNE", None)

# Workflows every process of the suite registers (workers run as child processes use them).
INSTALLED_APPS = [*INSTALLED_APPS, "tests.workapp"]

DATABASES = {
    "default": database_from_url(
        env("DATABASE_URL", default="")
        or f"sqlite:///{os.path.join(tempfile.gettempdir(), 'django_leases_tests.sqlite3')}"
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory: thread and process races need one shared database.
    DATABASES["default"]["TEST"] = {
        "NAME": os.path.join(tempfile.gettempdir(), f"django_leases_test_{os.getpid()}.sqlite3")
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # MariaDB / MySQL: the test database is named after DATABASE_URL's (``dl_maria`` gives
    # ``dl_maria_test``), with DL_TEST_DB_SUFFIX as below. A binary, NO PAD collation, so
    # keys and names match exactly as on the other backends ("a", "A" and "a " are three
    # keys); MySQL 8 spells it utf8mb4_0900_bin (DL_TEST_DB_COLLATION).
    DATABASES["default"]["TEST"] = {
        "NAME": f"{DATABASES['default']['NAME'] or 'dl_maria'}_test"
        + os.environ.get("DL_TEST_DB_SUFFIX", ""),
        "CHARSET": "utf8mb4",
        "COLLATION": os.environ.get("DL_TEST_DB_COLLATION", "utf8mb4_nopad_bin"),
    }
else:
    # PostgreSQL: the test database is named after DATABASE_URL's (``django_leases`` gives
    # ``test_django_leases``), so suites on differently named databases of one server never
    # drop each other's; DL_TEST_DB_SUFFIX separates two suites on the same name.
    DATABASES["default"]["TEST"] = {
        "NAME": f"test_{DATABASES['default']['NAME']}" + os.environ.get("DL_TEST_DB_SUFFIX", "")
    }
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}

# The Django Tasks backend (tests/test_tasks.py): Django 6's django.tasks, or the backport
# (the dev extra installs it); without either, the suite runs and test_tasks.py is skipped.
if find_spec("django.tasks") or find_spec("django_tasks"):
    TASKS = {
        "default": {
            "BACKEND": "django_leases.tasks.TaskBackend",
            "QUEUES": ["default"],
        },
        "retrying": {
            "BACKEND": "django_leases.tasks.TaskBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"retries": 2, "retry_delay": 30},
        },
    }
else:  # not the demo's TASKS either: its TaskBackend needs the Tasks API
    TASKS = {}
