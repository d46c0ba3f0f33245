"""``Renewal(deferred=True)``: threads only once a first renewal is due, same rules after."""

from __future__ import annotations

import threading
import time

from django_leases.renewal import Renewal, renewal_interval
from tests.helpers import unique_key, wait_until

#: Generous bound for polling a condition (never a timed assertion).
DEADLINE = 60.0
#: A renewal that must not be lost: renewed every second, so a starved renewal thread has two
#: seconds before its deadline (0.6 s left it 0.4 s).
RENEWED_TTL = 3.0


def _threads(name: str) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name in (f"lease-renewal:{name}", f"lease-deadline:{name}")
    ]


def test_a_deferred_renewal_stopped_before_its_first_renewal_starts_no_thread() -> None:
    name = unique_key("deferred")
    calls: list[int] = []
    renewal = Renewal(name, 3600.0, lambda: bool(calls.append(1)) or True, deferred=True)
    renewal.start()
    assert not _threads(name), "threads started before any renewal was due"
    renewal.stop()
    renewal.stop()  # idempotent
    assert not _threads(name)
    assert calls == []
    assert not renewal.lost.is_set()


def test_a_deferred_renewal_renews_every_interval_once_due() -> None:
    name = unique_key("deferred")
    ttl = RENEWED_TTL
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        return True

    renewal = Renewal(name, ttl, renew, deferred=True).start()
    try:
        wait_until(lambda: len(calls) >= 3, DEADLINE, what="three renewals")
        assert not renewal.lost.is_set()
        assert renewal_interval(ttl) > 0
    finally:
        renewal.stop()
    count = len(calls)
    assert not any(t.is_alive() for t in _threads(name)), "stop() left a renewal thread running"
    assert len(calls) == count, "a renewal ran after stop() returned"


def test_a_deferred_renewal_answered_not_held_marks_the_lease_lost() -> None:
    name = unique_key("deferred")
    told: list[bool] = []
    renewal = Renewal(name, 0.6, lambda: False, deferred=True, on_lost=lambda: told.append(True))
    renewal.start()
    try:
        wait_until(renewal.lost.is_set, DEADLINE, what="the lease seen lost")
        assert told == [True]
    finally:
        renewal.stop()


def test_a_deferred_renewal_that_keeps_failing_is_lost_at_its_deadline() -> None:
    name = unique_key("deferred")

    def renew() -> bool:
        raise OSError("database unreachable")

    began = time.monotonic()
    renewal = Renewal(name, 0.6, renew, deferred=True).start()
    try:
        wait_until(
            renewal.lost.is_set, DEADLINE, what="the lease seen lost once its deadline passed"
        )
        assert time.monotonic() >= began + 0.6, "lost before its deadline"
    finally:
        renewal.stop()
