"""The lease functions dropped after their migration ran (a restore without functions, a
hand-made ``DROP FUNCTION``), on PostgreSQL's tuned path.

They are the same kind of object as the workflow functions and lost the same way, so the
same promises hold: ``leases_check``, the health view and check E013 say they are missing,
``leases_check --install-functions`` creates them again as their migration froze them, and
no lease operation fails for want of one: outside a transaction it runs again on the plain
statement at once; inside one the failed call has aborted that transaction, so it raises,
and the next call is plain.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.core import checks
from django.db import DatabaseError, connection, transaction

from django_leases import health
from django_leases.models import Lease
from django_leases.models import lease as lease_module
from django_leases.models.lease import lease_functions

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def dropped() -> Iterator[list[str]]:
    """The three lease functions dropped; created again (and the process's memory of them
    being gone forgotten) afterwards."""
    made = lease_functions()
    with connection.cursor() as cursor:
        for name in made:
            cursor.execute(f"DROP FUNCTION {name}")
    try:
        yield list(made)
    finally:
        with connection.cursor() as cursor:
            for statement in made.values():
                cursor.execute(statement)
        lease_module._without_functions.clear()


def test_leases_check_and_e013_report_dropped_lease_functions(dropped: list[str]) -> None:
    report = health.run_checks(["default"])
    migrations = [c for c in report.as_dict()["checks"] if c["check"] == "migrations"]
    assert not report.healthy
    assert migrations[0]["status"] == "problem", migrations
    message = migrations[0]["message"]
    assert all(name in message for name in dropped), message
    assert "the lease functions" in message and "--install-functions" in message
    errors = [m for m in checks.run_checks(databases=["default"]) if m.id == "django_leases.E013"]
    assert len(errors) == 1 and dropped[0] in errors[0].msg


def test_install_functions_creates_the_dropped_lease_functions(dropped: list[str]) -> None:
    assert sorted(health.install_functions(connection)) == sorted(dropped)
    assert health.missing_functions(connection) == []
    assert health.install_functions(connection) == []  # nothing left to create
    lease = Lease.objects.acquire("dropped:repaired", holder="h", ttl=30)
    assert lease is not None and lease.token == 1
    assert connection.alias not in lease_module._without_functions, "it went plain"


def test_leases_work_on_without_the_functions_and_say_so_once(
    dropped: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_leases.db"):
        lease = Lease.objects.acquire("dropped:plain", holder="h", ttl=30)
        assert lease is not None and lease.token == 1
        assert Lease.objects.acquire("dropped:plain", holder="other", ttl=30) is None
        refreshed = Lease.objects.refresh(lease, 60)
        assert refreshed is not None and refreshed.token == 1
        assert Lease.objects.release(lease) is True
        assert Lease.objects.release(lease) is False
    warnings = [r for r in caplog.records if "lacks a lease function" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "--install-functions" in warnings[0].getMessage()
    taken = Lease.objects.acquire("dropped:plain", holder="other", ttl=30)
    assert taken is not None and taken.token == 2


@pytest.mark.parametrize("operation", ["refresh", "release"])
def test_each_operation_finds_its_function_gone_on_its_own(
    dropped: list[str], operation: str
) -> None:
    """A process whose first lease call after the drop is a refresh or a release (a hold
    that began before it) goes on as well."""
    lease_module._without_functions.add(connection.alias)  # the acquire: plain, as if gone
    lease = Lease.objects.acquire(f"dropped:{operation}", holder="h", ttl=30)
    assert lease is not None
    lease_module._without_functions.clear()  # the next call tries its function
    if operation == "refresh":
        refreshed = Lease.objects.refresh(lease, 60)
        assert refreshed is not None and refreshed.expires_at > lease.expires_at
    else:
        assert Lease.objects.release(lease) is True
    assert connection.alias in lease_module._without_functions


def test_inside_a_transaction_the_missing_function_raises_once(dropped: list[str]) -> None:
    with pytest.raises(DatabaseError), transaction.atomic():
        Lease.objects.acquire("dropped:atomic", holder="h", ttl=30)
    assert connection.alias in lease_module._without_functions
    with transaction.atomic():
        lease = Lease.objects.acquire("dropped:atomic", holder="h", ttl=30)
    assert lease is not None and lease.token == 1
