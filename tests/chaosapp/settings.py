"""Settings of the chaos test's worker processes: the test settings plus this app, with short
leases read from the environment (seconds):

* ``CHAOS_STEP_LEASE_TTL`` → ``STEP_LEASE_TTL`` (default 2);
* ``CHAOS_RUN_LEASE_TTL`` → ``DEFAULT_TTL``, the run lease of an orchestration pass
  (default 3);
* ``CHAOS_POLL_INTERVAL`` → ``WORKER_POLL_INTERVAL`` (default 0.5).

``TASKS`` adds the task chaos test's backend (``tests.chaosapp.config``).

Worker connections are persistent (``CONN_MAX_AGE = None``), as in production. ``django_leases``
logs go to stderr at ``CHAOS_LOG_LEVEL`` (default ``WARNING``: superseded
writes and lost leases show).
"""

import os

from tests.chaosapp.config import TASK_BACKEND, TASK_BACKEND_SETTINGS
from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DJANGO_LEASES, INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaosapp"]
if TASKS:  # the Tasks API is installed
    TASKS = {**TASKS, TASK_BACKEND: TASK_BACKEND_SETTINGS}
# Persistent connections, as a production worker would run: a killed one must be replaced.
DATABASES["default"]["CONN_MAX_AGE"] = None

DJANGO_LEASES = {
    **DJANGO_LEASES,
    "STEP_LEASE_TTL": float(os.environ.get("CHAOS_STEP_LEASE_TTL", "2")),
    "DEFAULT_TTL": float(os.environ.get("CHAOS_RUN_LEASE_TTL", "3")),
    "WORKER_POLL_INTERVAL": float(os.environ.get("CHAOS_POLL_INTERVAL", "0.5")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_leases": {
            "handlers": ["console"],
            "level": os.environ.get("CHAOS_LOG_LEVEL", "WARNING"),
        }
    },
}
