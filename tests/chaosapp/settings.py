"""Settings of the chaos test's worker processes: the test settings plus this app, with short
leases read from the environment (seconds):

* ``CHAOS_STEP_LEASE_TTL`` → ``STEP_LEASE_TTL`` (default 2);
* ``CHAOS_RUN_LEASE_TTL`` → ``DEFAULT_TTL``, the run lease of an orchestration pass
  (default 3);
* ``CHAOS_POLL_INTERVAL`` → ``WORKER_POLL_INTERVAL`` (default 0.5).
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DJANGO_LEASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaosapp"]

DJANGO_LEASES = {
    **DJANGO_LEASES,
    "STEP_LEASE_TTL": float(os.environ.get("CHAOS_STEP_LEASE_TTL", "2")),
    "DEFAULT_TTL": float(os.environ.get("CHAOS_RUN_LEASE_TTL", "3")),
    "WORKER_POLL_INTERVAL": float(os.environ.get("CHAOS_POLL_INTERVAL", "0.5")),
}
