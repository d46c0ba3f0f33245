"""Settings of the prune test's worker processes: the test settings plus
``DJANGO_LEASES["PRUNE"]``, a prune every second (six fields, the seconds first) of runs that
finished more than an hour ago, two per transaction. Worker connections are persistent, as in
production. With ``PRUNE_BAD_SETTING`` set, a ``PRUNE`` that check E031 refuses."""

import os
from datetime import timedelta

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DJANGO_LEASES

DATABASES["default"]["CONN_MAX_AGE"] = None

DJANGO_LEASES = {
    **DJANGO_LEASES,
    "PRUNE": {"schedule": "* * * * * *", "older_than": timedelta(hours=1), "batch_size": 2},
}
if os.environ.get("PRUNE_BAD_SETTING"):
    DJANGO_LEASES["PRUNE"] = {"schedule": "* * * * * *", "older_than": -60}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_leases": {"handlers": ["console"], "level": "WARNING"}},
}
