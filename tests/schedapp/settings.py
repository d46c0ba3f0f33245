"""Settings of the schedule test's worker processes: the test settings plus this app, and
``DJANGO_LEASES["SCHEDULES"]`` with one per-second schedule (``every-second``, six fields, the
seconds first) of ``tests.sched.tick``. Worker connections are persistent, as in production.
With ``SCHED_BAD_ENTRY`` set, a second entry whose time zone does not exist is added (check
E026). With ``SCHED_OVERLAP`` set, the per-second schedule is replaced by three of
``tests.sched.slow`` (runs live 2 s, longer than a tick), one per overlap policy: ``skip``,
``buffer_one`` and ``cancel_other``, and ``task-second``, which enqueues the ``@task``
``tests.workapp.tasks.add`` each second (``test_schedule_overlap_workers``)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DJANGO_LEASES, INSTALLED_APPS, TASKS

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

if os.environ.get("SCHED_OVERLAP"):
    DJANGO_LEASES["SCHEDULES"] = {
        policy: {
            "workflow": "tests.sched.slow",
            "cron": "* * * * * *",
            "input": {"nap": 2},
            "overlap": policy,
        }
        for policy in ("skip", "buffer_one", "cancel_other")
    }
    # And a Django @task enqueued every second (every tick: "allow"), where the Tasks
    # framework is installed.
    if TASKS:
        DJANGO_LEASES["SCHEDULES"]["task-second"] = {
            "task": "tests.workapp.tasks.add",
            "cron": "* * * * * *",
            "args": [1, 2],
            "overlap": "allow",
        }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_leases": {"handlers": ["console"], "level": "WARNING"}},
}
