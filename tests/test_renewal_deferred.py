"""A lease on the renewer costs nothing until its first renewal is due, and follows the rules
after: what ``Renewal(deferred=True)`` — a lease's own threads, started only once due —
pinned before every holder moved to the process's renewer (issue 31). The renew callable's
answers (held, not held, raising) are ``tests/test_renewer.py``'s."""

from __future__ import annotations

import threading
import time

import pytest

from django_leases.renewal import Renewer, renewal_interval
from tests.helpers import end_renewers, unique_key, wait_until

#: Generous bound for polling a condition (never a timed assertion).
DEADLINE = 60.0
#: A renewal that must not be lost: renewed every second, so a starved renewal thread has two
#: seconds before its deadline (0.6 s left it 0.4 s).
RENEWED_TTL = 3.0


def _own_threads(name: str) -> list[threading.Thread]:
    """Threads of the lease ``name``'s own (none: the renewer's two threads serve them all)."""
    own = (f"lease-renewal:{name}", f"lease-deadline:{name}")
    return [t for t in threading.enumerate() if t.name in own]


def test_a_lease_stopped_before_its_first_renewal_costs_no_call_and_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique_key("deferred")
    calls: list[int] = []
    renewer = Renewer(name)
    lease = renewer.lease(name, 3600.0, renew=lambda: bool(calls.append(1)) or True)
    lease.start()
    assert not _own_threads(name)
    lease.stop()
    lease.stop()  # idempotent
    assert calls == []
    assert not lease.lost.is_set()
    end_renewers(monkeypatch, renewer)


def test_a_lease_is_renewed_every_interval_and_never_after_stop_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique_key("deferred")
    ttl = RENEWED_TTL
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        return True

    renewer = Renewer(name)
    lease = renewer.lease(name, ttl, renew=renew).start()
    try:
        wait_until(lambda: len(calls) >= 3, DEADLINE, what="three renewals")
        assert not lease.lost.is_set()
        assert renewal_interval(ttl) > 0
        assert not _own_threads(name)
    finally:
        lease.stop()
    count = len(calls)
    assert not lease.in_flight
    assert renewer.held() == []
    end_renewers(monkeypatch, renewer)
    assert len(calls) == count, "a renewal ran after stop() returned"
