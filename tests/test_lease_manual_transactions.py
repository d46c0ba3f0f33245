"""Lease operations and starts work under manual transaction management (``set_autocommit(False)``).

Rule: ``Lease.objects.acquire`` / ``release`` are plain statements that a caller may run in a
transaction it manages itself (Django's documented ``set_autocommit(False)`` + ``commit()``).
Sending ``lease_acquired`` / ``lease_released`` "once the transaction commits" must not turn a
granted lease into an exception: Django's ``transaction.on_commit`` raises
``TransactionManagementError`` when autocommit is off outside ``atomic()``, so the grant (or
the release) has already been made when the caller is told it failed.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from django_leases.models import Lease, WorkflowRun
from django_leases.signals import lease_acquired, lease_released, run_started
from django_leases.workflows import start_workflow
from tests.helpers import tuned_sql, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_acquire_and_release_under_manual_transaction_management() -> None:
    key = unique_key("manual-transactions")
    heard: list[str] = []

    def on_acquired(sender: Any, **kwargs: Any) -> None:
        heard.append("acquired")

    def on_released(sender: Any, **kwargs: Any) -> None:
        heard.append("released")

    lease_acquired.connect(on_acquired, weak=False)
    lease_released.connect(on_released, weak=False)
    transaction.set_autocommit(False)
    try:
        lease = Lease.objects.acquire(key, "manual", 60)  # raises TransactionManagementError
        assert lease is not None
        transaction.commit()
        assert Lease.objects.release(lease)
        transaction.commit()
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
        lease_acquired.disconnect(on_acquired)
        lease_released.disconnect(on_released)
    assert Lease.objects.filter(key=key, released_at__isnull=False).exists()


def test_a_workflow_started_under_manual_transaction_management_is_told() -> None:
    """The same for a run: ``start_workflow`` inside a transaction the caller manages writes
    the run and sends ``run_started`` rather than raising after the run was written. Every
    signal of the package waits for the commit through one helper (``db.after_commit``)."""
    heard: list[str] = []

    def on_started(sender: Any, workflow: str, **kwargs: Any) -> None:
        heard.append(workflow)

    run_started.connect(on_started, weak=False)
    transaction.set_autocommit(False)
    try:
        with tuned_sql(False):
            run_id = start_workflow("tests.sub.two-steps", {})
        transaction.commit()
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
        run_started.disconnect(on_started)
    assert WorkflowRun.objects.filter(pk=run_id).exists()
    assert heard == ["tests.sub.two-steps"]


def test_a_hold_and_a_worker_are_refused_under_manual_transaction_management() -> None:
    """``hold_lease`` and a workflow worker refuse a caller's manual transaction as they
    refuse ``atomic()``: the grant would stay invisible until the caller commits, and the
    worker's threads would never see the transaction's rows."""
    from django_leases import hold_lease
    from django_leases.exceptions import MisuseError
    from django_leases.workflows.worker import Worker

    transaction.set_autocommit(False)
    try:
        with pytest.raises(MisuseError, match="autocommit off"), hold_lease("manual-hold", ttl=5):
            pass
        with pytest.raises(MisuseError, match="autocommit off"):
            Worker()._check_ready()
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
