"""The contenders' no-op tasks, declared with each library's public API.

One ``django.tasks`` ``@task``, :func:`noop`, serves the three Django Tasks backends, so their
task code is identical: django-ox is the ``default`` backend of :mod:`wfbench.settings`,
django-tasks-db is ``db`` and django-leases' ``TaskBackend`` is ``leases``; each contender
enqueues ``noop.using(backend=...)``, and each worker imports ``wfbench.tasks.noop`` and runs
it on its own backend. Procrastinate's Django integration finds this module by its ``tasks``
autodiscovery.
"""

from __future__ import annotations

from django.tasks import task
from procrastinate.contrib.django import app


@task
def noop() -> None:
    """The no-op: every Django Tasks contender runs this one function."""
    return None


ox_noop = noop
db_noop = noop.using(backend="db")
leases_noop = noop.using(backend="leases")


@app.task(name="wfbench.noop")
def procrastinate_noop() -> None:
    """Procrastinate's no-op (its own decorator; the body is the same)."""
    return None
