"""Leases are judged on the database clock, whatever the application's clock says.

The application clock (``time.time``, ``datetime.now``, ``timezone.now``) is moved an hour
ahead or behind with time-machine; the database's is left alone. Acquire, refresh, lapse,
takeover, ``current`` and ``with_state`` must behave exactly as with a true clock. They must
also be correct with ``USE_TZ = False`` (naive datetimes, in a zone with daylight saving).
Each runs on the single-statement SQL path and on the portable ORM fallback.

Leases lapse on the database clock (:func:`tests.helpers.lapse_lease`), never by waiting; the
one test whose subject is the renewal thread polls until the database clock has passed the
lease's first expiry with the lease still held.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_leases import hold_lease
from django_leases.models import Lease, LeaseState
from tests.helpers import lapse_lease, unique_key, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 60.0
#: The renewal test's TTL: renewed every second, so a starved renewal thread has two seconds.
RENEWED_TTL = 3.0
#: How far a timestamp written by the database may be from the database's own "now" when
#: read back at once: generous, and far below the hour the application clock is moved by.
NEAR = timedelta(minutes=5)


@pytest.fixture(params=[timedelta(hours=1), timedelta(hours=-1)], ids=["ahead", "behind"])
def skewed_app_clock(request: pytest.FixtureRequest) -> Iterator[timedelta]:
    """The application clock moved an hour ahead or behind (it keeps ticking)."""
    shift: timedelta = request.param
    real_now = datetime.now(UTC)
    with time_machine.travel(real_now + shift, tick=True):
        assert abs(timezone.now() - (real_now + shift)) < NEAR  # the travel took effect
        yield shift


def _db_now() -> datetime:
    lease = Lease.objects.with_state().first()
    assert lease is not None
    return lease.db_now  # type: ignore[attr-defined]


def _state(key: str) -> tuple[str, float]:
    lease = Lease.objects.with_state().get(key=key)
    return lease.state, lease.seconds_left(lease.db_now)  # type: ignore[attr-defined]


def _exercise_lease_rules(key: str) -> None:
    """Acquire, refresh, refuse, lapse, take over, release: the rules a clock could break."""
    first = Lease.objects.acquire(key, "a", TTL)
    assert first is not None and first.token == 1
    # Timestamps come from the database clock, not the (moved) application clock.
    db_now = _db_now()
    assert abs(first.renewed_at - db_now) < NEAR
    assert timedelta(0) < first.expires_at - first.renewed_at <= timedelta(seconds=TTL)
    assert Lease.objects.acquire(key, "b", 60) is None
    current = Lease.objects.current(key)
    assert current is not None and current.holder == "a"
    state, left = _state(key)
    assert state == LeaseState.LIVE and 0 < left <= TTL

    refreshed = Lease.objects.refresh(first, TTL)
    assert refreshed is not None and refreshed.token == 1
    assert refreshed.expires_at >= first.expires_at

    lapse_lease(key)
    lapsed_at = Lease.objects.get(key=key).expires_at
    assert Lease.objects.current(key) is None
    assert _state(key) == (LeaseState.LAPSED, 0.0)
    # Lapsed on the database clock: no refresh, even though nobody took it.
    assert Lease.objects.refresh(refreshed, 60) is None

    second = Lease.objects.acquire(key, "b", 60)
    assert second is not None and (second.holder, second.token) == ("b", 2)
    assert second.renewed_at >= lapsed_at
    assert Lease.objects.refresh(first, 60) is None
    Lease.objects.release(second)
    assert _state(key)[0] == LeaseState.RELEASED
    assert Lease.objects.current(key) is None
    third = Lease.objects.acquire(key, "a", 60)
    assert third is not None and third.token == 3


def test_skewed_app_clock_changes_nothing(skewed_app_clock: timedelta, sql_path: str) -> None:
    _exercise_lease_rules(unique_key("clock"))


def test_refresh_refused_once_lapsed_on_db_clock_while_app_clock_lags(sql_path: str) -> None:
    """The application clock an hour behind thinks the lease has long to live; the
    database says it lapsed, and the database wins."""
    key = unique_key("clock")
    with time_machine.travel(datetime.now(UTC) - timedelta(hours=1), tick=True):
        lease = Lease.objects.acquire(key, "a", TTL)
        assert lease is not None
        assert lease.expires_at > timezone.now()  # by the lagging app clock it is "live"
        lapse_lease(key)
        # Even the lapsed expiry is an hour ahead of the lagging app clock.
        assert Lease.objects.get(key=key).expires_at > timezone.now()
        assert Lease.objects.refresh(lease, 60) is None
        assert Lease.objects.current(key) is None
        taken = Lease.objects.acquire(key, "b", 60)
        assert taken is not None and taken.token == lease.token + 1


def test_app_clock_ahead_does_not_lapse_a_live_lease(sql_path: str) -> None:
    """The application clock an hour ahead thinks the lease lapsed long ago; the database
    says it is live, so it refreshes and others are refused."""
    key = unique_key("clock")
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=1), tick=True):
        lease = Lease.objects.acquire(key, "a", 60)
        assert lease is not None
        assert lease.expires_at < timezone.now()  # by the hasty app clock it has "lapsed"
        assert Lease.objects.refresh(lease, 60) is not None
        assert Lease.objects.acquire(key, "b", 60) is None


def test_hold_lease_renews_under_a_skewed_app_clock(skewed_app_clock: timedelta) -> None:
    """The renewal thread keeps the lease past its first expiry on the database clock."""
    key = unique_key("clock")
    with hold_lease(key, RENEWED_TTL) as held:
        first_expiry = held.lease.expires_at
        wait_until(
            lambda: Lease.objects.filter(key=key, renewed_at__gt=first_expiry).exists(),
            60,
            what="a renewal after the lease's first expiry",
        )
        assert not held.lost.is_set()
        current = Lease.objects.current(key)
        assert current is not None and current.holder == held.lease.holder
    assert Lease.objects.current(key) is None


@pytest.fixture
def naive_datetimes() -> Iterator[None]:
    """``USE_TZ = False`` in a zone with daylight saving, on a fresh connection.

    PostgreSQL reads its instants in that zone; SQLite and MariaDB / MySQL keep the
    library's naive times in UTC (no time zone tables needed).
    """
    connection.close()
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        connection.close()
        yield
        connection.close()
    connection.close()


def test_use_tz_false(naive_datetimes: None, sql_path: str) -> None:
    key = unique_key("clock")
    _exercise_lease_rules(key)
    lease = Lease.objects.acquire(unique_key("clock"), "a", 60)
    assert lease is not None
    for value in (lease.expires_at, lease.renewed_at, lease.acquired_at):
        assert value is not None and timezone.is_naive(value)
    # What acquire returns is what the ORM reads back.
    stored = Lease.objects.get(pk=lease.pk)
    assert (stored.expires_at, stored.renewed_at, stored.acquired_at, stored.token) == (
        lease.expires_at,
        lease.renewed_at,
        lease.acquired_at,
        lease.token,
    )
    refreshed = Lease.objects.refresh(lease, 120)
    assert refreshed is not None
    assert timezone.is_naive(refreshed.expires_at)
    assert Lease.objects.get(pk=lease.pk).expires_at == refreshed.expires_at


def test_aware_results_match_what_the_orm_reads(sql_path: str) -> None:
    """With ``USE_TZ = True`` acquire and refresh return aware UTC datetimes equal to the
    stored ones."""
    lease = Lease.objects.acquire(unique_key("clock"), "a", 60)
    assert lease is not None
    assert timezone.is_aware(lease.expires_at)
    stored = Lease.objects.get(pk=lease.pk)
    assert (stored.expires_at, stored.renewed_at, stored.acquired_at) == (
        lease.expires_at,
        lease.renewed_at,
        lease.acquired_at,
    )
    refreshed = Lease.objects.refresh(lease, 120)
    assert refreshed is not None
    assert Lease.objects.get(pk=lease.pk).expires_at == refreshed.expires_at
