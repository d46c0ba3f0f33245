"""Lease signals against transactions, and small edges of the hold_lease command and renewals.

Rules: ``lease_acquired``/``lease_released`` are sent once the transaction commits, never for
a rolled-back one, at once outside a transaction; ``hold_lease`` sends acquired before
released; a ``NUL`` in the command is refused before anything runs; a failed renewal is
tried again after half an interval.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from django_leases import hold_lease
from django_leases.holder import LeaseHolder
from django_leases.models import Lease
from django_leases.renewal import renewal_interval, retry_interval
from django_leases.signals import lease_acquired, lease_released
from tests.helpers import end_renewers, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard() -> Any:
    log: list[tuple[str, str]] = []

    def acquired(sender: Any, lease: Lease, **kwargs: Any) -> None:
        log.append(("acquired", lease.key))

    def released(sender: Any, lease: Lease, **kwargs: Any) -> None:
        log.append(("released", lease.key))

    lease_acquired.connect(acquired, weak=False)
    lease_released.connect(released, weak=False)
    yield log
    lease_acquired.disconnect(acquired)
    lease_released.disconnect(released)


def test_rolled_back_grant_and_release_are_not_announced(heard: list[tuple[str, str]]) -> None:
    key = unique_key("signals-rolled-back")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert Lease.objects.acquire(key, "a", 60) is not None
        assert heard == []
        raise RuntimeError("roll back")
    assert heard == []
    with transaction.atomic():
        lease = Lease.objects.acquire(key, "a", 60)
        assert lease is not None
        with pytest.raises(RuntimeError), transaction.atomic():  # a savepoint
            Lease.objects.release(lease)
            raise RuntimeError("roll the release back")
    assert heard == [("acquired", key)]
    assert Lease.objects.release(lease)
    assert heard == [("acquired", key), ("released", key)]


def test_hold_lease_announces_acquired_then_released(
    heard: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = unique_key("signals-hold")
    with hold_lease(key, 30):
        assert heard == [("acquired", key)]
    end_renewers(monkeypatch)
    assert heard == [("acquired", key), ("released", key)]


def test_a_nul_in_the_command_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        LeaseHolder("k", ["echo", "a\0b"], ttl=30)


def test_retry_interval_is_half_the_interval_above_the_floor() -> None:
    assert retry_interval(30) == pytest.approx(renewal_interval(30) / 2)
    assert retry_interval(30) < renewal_interval(30)
