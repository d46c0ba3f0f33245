"""Renewal threads and database connections: killed connections, and nothing left behind.

* PostgreSQL: the renewal thread's connection is killed with ``pg_terminate_backend``; the
  next renewal fails, the one after reconnects, and the lease is still held. With new
  connections refused as well, the loss is reported (once the local deadline has passed).
* After many ``hold_lease`` enter/exit cycles (each with renewals) no connection is left
  open (PostgreSQL: ``pg_stat_activity``) and no renewal thread survives (every backend):
  the renewer's threads end, closing their connection, once nothing is held for
  ``RENEWER_IDLE`` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from django_leases import LeaseLostError, ahold_lease, hold_lease
from django_leases.models import Lease, LeaseQuerySet
from tests.helpers import renewal_threads, terminate_other_backends, unique_key, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CYCLES = 20
CYCLE_TTL = 1.5
#: How long a wait for a renewal (or a loss) may take: generous, never a timing claim.
PATIENCE = 60.0


def _renewed_at(key: str) -> object:
    return Lease.objects.filter(key=key).values_list("renewed_at", flat=True).get()


def _wait_for_renewals(key: str, count: int) -> None:
    """Wait until the row's ``renewed_at`` has moved ``count`` times."""
    seen = [_renewed_at(key)]

    def moved() -> bool:
        now = _renewed_at(key)
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > count

    wait_until(moved, PATIENCE, what=f"{count} renewal(s) of {key}")


def _backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@contextmanager
def _new_connections_refused() -> Iterator[None]:
    """Refuse new connections to the test database (set from the maintenance database)."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    try:
        yield
    finally:
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")


@pytest.mark.postgres_only
def test_renewal_recovers_after_its_connection_is_killed(caplog: pytest.LogCaptureFixture) -> None:
    key, ttl = unique_key("connections"), 3.0
    caplog.set_level(logging.WARNING, logger="django_leases")
    with hold_lease(key, ttl) as held:
        # A first renewal gives the renewal thread its own connection.
        _wait_for_renewals(key, 1)
        assert terminate_other_backends() >= 1
        # The next renewal fails on the dead connection, the one after reconnects.
        _wait_for_renewals(key, 2)
        assert not held.lost.is_set(), "a killed connection cost the lease"
        current = Lease.objects.current(key)
        assert current is not None and current.token == held.token
    assert any("Renewal of lease" in r.getMessage() for r in caplog.records), (
        "no renewal failed: the kill missed the renewal thread's connection"
    )
    assert Lease.objects.current(key) is None


#: Holds a test may start again when a loaded machine kept a 1 s TTL's first renewal from
#: landing in time (the lease is then lost before the fault the test is about).
HOLD_TRIES = 5


@pytest.mark.postgres_only
def test_loss_reported_within_ttl_when_renewals_cannot_reconnect() -> None:
    """A hold whose renewals cannot reconnect learns it lost the lease, and the key is free
    once its TTL has passed on the database clock (a lease seen lost past its local deadline
    is not released: it lapses; the database's expiry may be a moment later than the local
    deadline, counted from when the last renewal was sent). The renewal thread is the
    subject, so the TTL is 1 s: a hold whose first renewal did not land before its TTL (a
    loaded machine) is started again, never counted either way."""
    for _try in range(HOLD_TRIES):
        key, ttl = unique_key("connections"), 1.0
        with pytest.raises(LeaseLostError), hold_lease(key, ttl) as held:
            first = _renewed_at(key)
            renewed = wait_until(
                lambda: held.lost.is_set() or _renewed_at(key) != first,  # noqa: B023
                PATIENCE,
                what=f"a renewal of {key}, or its loss",
            )
            if held.lost.is_set():  # lost before the fault: the machine was too slow
                continue
            assert renewed
            with _new_connections_refused():
                terminate_other_backends()
                assert held.lost.wait(PATIENCE), "the unreachable database went unnoticed"
        wait_until(
            lambda: Lease.objects.current(key) is None,  # noqa: B023
            PATIENCE,
            what=f"{key} to lapse",
        )
        return
    pytest.fail(f"no hold of a 1 s TTL renewed once in {HOLD_TRIES} tries")


def _cycle_many(renewals: list[int]) -> None:
    """Hold and release one key CYCLES times (plus 10 async holds), each hold lasting until
    its renewal thread has renewed once, so every cycle opened a renewal connection.

    TTL 1.5 s renews every 0.5 s; a cycle waits for its renewal by polling, with a deadline
    far past the renewal interval, so a loaded machine slows the test down but cannot fail it.
    """
    key = unique_key("connections")
    for _ in range(CYCLES):
        seen = renewals[0]
        with hold_lease(key, CYCLE_TTL):
            wait_until(lambda s=seen: renewals[0] > s, PATIENCE, what="a renewal")

    async def async_cycle() -> None:
        seen = renewals[0]
        async with ahold_lease(key, CYCLE_TTL):
            while renewals[0] <= seen:
                await _asleep(0.05)

    for _ in range(10):
        async_to_sync(async_cycle)()
    assert Lease.objects.get(key=key).token == CYCLES + 10
    assert Lease.objects.current(key) is None


async def _asleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


@pytest.fixture
def renewal_count() -> Iterator[list[int]]:
    """Counts leases refreshed by the renewer's thread, to prove the cycles renewed at all."""
    count = [0]
    real = LeaseQuerySet.refresh_many

    def counting(queryset: LeaseQuerySet, held: Sequence[tuple[Lease, float]]) -> Any:
        if threading.current_thread().name.startswith("lease-renewer:"):
            count[0] += len(held)
        return real(queryset, held)

    from unittest import mock

    with mock.patch.object(LeaseQuerySet, "refresh_many", counting):
        yield count


@pytest.mark.postgres_only
def test_hold_lease_cycles_leave_no_connection_behind(renewal_count: list[int]) -> None:
    before = _backends()
    _cycle_many(renewal_count)
    assert renewal_count[0] >= CYCLES, "the cycles did not renew, so they proved nothing"
    wait_until(lambda: _backends() <= before, PATIENCE, what="the connections to close")


def test_hold_lease_cycles_leave_no_renewal_thread_behind(renewal_count: list[int]) -> None:
    _cycle_many(renewal_count)
    assert renewal_count[0] >= CYCLES, "the cycles did not renew, so they proved nothing"
    wait_until(lambda: not renewal_threads(), PATIENCE, what="the renewal threads to end")
