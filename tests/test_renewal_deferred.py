"""``Renewal(deferred=True)``: threads only once a first renewal is due, same rules after."""

from __future__ import annotations

import threading
import time
import uuid

from django_leases.renewal import Renewal, renewal_interval

#: Generous bound for polling a condition (never a timed assertion).
DEADLINE = 60.0


def _threads(name: str) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name in (f"lease-renewal:{name}", f"lease-deadline:{name}")
    ]


def _wait_for(condition: object, what: str) -> None:
    give_up = time.monotonic() + DEADLINE
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < give_up, what
        time.sleep(0.01)


def test_a_deferred_renewal_stopped_before_its_first_renewal_starts_no_thread() -> None:
    name = f"deferred:{uuid.uuid4().hex[:8]}"
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
    name = f"deferred:{uuid.uuid4().hex[:8]}"
    ttl = 0.6
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        return True

    renewal = Renewal(name, ttl, renew, deferred=True).start()
    try:
        _wait_for(lambda: len(calls) >= 3, "three renewals")
        assert not renewal.lost.is_set()
        assert renewal_interval(ttl) > 0
    finally:
        renewal.stop()
    count = len(calls)
    assert not any(t.is_alive() for t in _threads(name)), "stop() left a renewal thread running"
    assert len(calls) == count, "a renewal ran after stop() returned"


def test_a_deferred_renewal_answered_not_held_marks_the_lease_lost() -> None:
    name = f"deferred:{uuid.uuid4().hex[:8]}"
    told: list[bool] = []
    renewal = Renewal(name, 0.6, lambda: False, deferred=True, on_lost=lambda: told.append(True))
    renewal.start()
    try:
        _wait_for(renewal.lost.is_set, "the lease seen lost")
        assert told == [True]
    finally:
        renewal.stop()


def test_a_deferred_renewal_that_keeps_failing_is_lost_at_its_deadline() -> None:
    name = f"deferred:{uuid.uuid4().hex[:8]}"

    def renew() -> bool:
        raise OSError("database unreachable")

    began = time.monotonic()
    renewal = Renewal(name, 0.6, renew, deferred=True).start()
    try:
        _wait_for(renewal.lost.is_set, "the lease seen lost once its deadline passed")
        assert time.monotonic() >= began + 0.6, "lost before its deadline"
    finally:
        renewal.stop()
