"""The peers' no-op tasks, declared with each library's public API.

django-ox and django-tasks-db are ``django.tasks`` backends (aliases ``default`` and ``db`` in
:mod:`wfbench.settings`); Procrastinate's Django integration finds this module by its
``tasks`` autodiscovery.
"""

from __future__ import annotations

from django.tasks import task
from procrastinate.contrib.django import app


def _noop() -> None:
    return None


@task
def ox_noop() -> None:
    """django-ox (backend ``default``)."""
    return _noop()


@task(backend="db")
def db_noop() -> None:
    """django-tasks-db (backend ``db``)."""
    return _noop()


@app.task(name="wfbench.noop")
def procrastinate_noop() -> None:
    """Procrastinate."""
    return _noop()
