"""A caller's ``transaction.atomic()`` covers django-leases' writes only when they go to the
same database: with a router sending django_leases to another alias, a run or a lease is
committed there at once, whatever the caller's transaction does (docs/howto/workflows.md,
docs/concepts/leases.md).

PostgreSQL only: the other alias is a second connection to the test database, which SQLite
cannot give while the caller's IMMEDIATE transaction holds the file's write lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.utils import load_backend

from django_leases.models import Lease, WorkflowRun
from django_leases.workflows import start_workflow, workflow

ALIAS = "leases_elsewhere"

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@workflow("tests.routed-run")
def _routed_run(run: Any, input: Any) -> Any:
    return input


class LeasesElsewhere:
    """Every django_leases model is read and written on :data:`ALIAS`."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return ALIAS if model._meta.app_label == "django_leases" else None

    db_for_write = db_for_read


class Rollback(Exception):
    pass


@pytest.fixture
def elsewhere(settings: Any) -> Iterator[str]:
    """:data:`ALIAS`: a second connection to the test database, and the router to it.

    The connection is made for this thread only (not in ``DATABASES``), which Django's test
    case allows as a connection created on the fly.
    """
    config = dict(connections["default"].settings_dict)
    wrapper = load_backend(config["ENGINE"]).DatabaseWrapper(config, ALIAS)
    connections[ALIAS] = wrapper
    settings.DATABASE_ROUTERS = [f"{__name__}.LeasesElsewhere"]
    try:
        yield ALIAS
    finally:
        wrapper.close()
        del connections[ALIAS]


def test_without_a_router_the_run_exists_only_if_the_callers_transaction_commits() -> None:
    with pytest.raises(Rollback), transaction.atomic():
        run_id = start_workflow("tests.routed-run", {"n": 1})
        raise Rollback
    assert not WorkflowRun.objects.filter(pk=run_id).exists()


def test_a_run_routed_elsewhere_is_committed_at_once(elsewhere: str) -> None:
    with pytest.raises(Rollback), transaction.atomic():  # on "default"
        run_id = start_workflow("tests.routed-run", {"n": 2})
        raise Rollback
    assert WorkflowRun.objects.using(elsewhere).filter(pk=run_id).exists()


def test_a_lease_routed_elsewhere_is_committed_at_once(elsewhere: str) -> None:
    with pytest.raises(Rollback), transaction.atomic():  # on "default"
        assert Lease.objects.acquire("routed:key", "holder-a", 30) is not None
        raise Rollback
    current = Lease.objects.using(elsewhere).current("routed:key")
    assert current is not None and current.holder == "holder-a"
