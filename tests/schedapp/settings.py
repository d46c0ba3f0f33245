"""Settings of the schedule test's worker processes: the test settings plus this app, and
``DJANGO_LEASES["SCHEDULES"]`` with one per-second schedule (``every-second``, six fields, the
seconds first) of ``tests.sched.tick``. Worker connections are persistent, as in production.
With ``SCHED_BAD_ENTRY`` set, a second entry whose time zone does not exist is added (check
E026)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DJANGO_LEASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.schedapp"]
DATABASES["default"]["CONN_MAX_AGE"] = None

DJANGO_LEASES = {
    **DJANGO_LEASES,
    "SCHEDULES": {
        "every-second": {
            "workflow": "tests.sched.tick",
            "cron": "* * * * * *",
            "input": {"from": "settings"},
            "overlap": "allow",
        }
    },
}
if os.environ.get("SCHED_BAD_ENTRY"):
    DJANGO_LEASES["SCHEDULES"]["bad-zone"] = {
        "workflow": "tests.sched.tick",
        "cron": "0 3 * * *",
        "timezone": "Europe/Atlantis",
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_leases": {"handlers": ["console"], "level": "WARNING"}},
}
