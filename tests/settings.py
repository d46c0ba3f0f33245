"""Test settings: the demo project's, on the database named by ``DATABASE_URL``.

``make test`` runs the suite twice: SQLite (a file, so threads and processes share it) and
PostgreSQL (``postgres://postgres@127.0.0.1:5432/django_leases``).
"""

import os
import tempfile

from demo_project.settings import *  # noqa: F403
from demo_project.settings import INSTALLED_APPS, database_from_url, env

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
else:
    # PostgreSQL: the test database is named after DATABASE_URL's (``django_leases`` gives
    # ``test_django_leases``), so suites on differently named databases of one server never
    # drop each other's; DL_TEST_DB_SUFFIX separates two suites on the same name.
    DATABASES["default"]["TEST"] = {
        "NAME": f"test_{DATABASES['default']['NAME']}" + os.environ.get("DL_TEST_DB_SUFFIX", "")
    }
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
