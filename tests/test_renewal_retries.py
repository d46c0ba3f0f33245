"""A renewal that proved nothing is tried again sooner than a renewal that held.

With renewals every TTL/3 from the last one sent, a lease whose renewal failed once had one
more try before its local deadline, and a third due at the very moment the watchdog marks it
lost: two failures in a row (a database restarting, two killed connections) cost the lease.
A failed try is retried after half an interval, so one failure leaves at least two more.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError

from django_leases.renewal import renewer, retry_interval
from tests.helpers import end_renewers


@pytest.fixture(autouse=True)
def _renewers_ended(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    yield
    end_renewers(monkeypatch)


def test_a_failed_renewal_is_tried_again_after_half_an_interval() -> None:
    """Deterministic: the second try reads the due time the failed tick set, which is half an
    interval (no more) after the failed try."""
    tries: list[tuple[float, float]] = []  # (when the try ran, the due time it was run for)
    second = threading.Event()

    def renew() -> bool:
        tries.append((time.monotonic(), renewal.due))
        if len(tries) == 1:
            raise OperationalError("the database is restarting")
        second.set()
        return True

    renewal = renewer("default").lease("retried", 6.0, renew=renew)
    renewal.start()
    try:
        assert second.wait(30), "no second try"
    finally:
        renewal.stop()
    first_try = tries[0][0]
    due_after_failure = tries[1][1]
    assert due_after_failure - first_try <= retry_interval(6.0) < renewal.interval
    assert not renewal.lost.is_set()


def test_two_failures_in_a_row_leave_the_lease_held() -> None:
    """Two failed tries, then one that holds, all before the local deadline: the lease is
    kept (a TTL of 6 s: tries at 2, 3 and 4 s; before, the third came at 6 s, the deadline)."""
    tries: list[float] = []
    third = threading.Event()

    def renew() -> bool:
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise OperationalError("the database is restarting")
        third.set()
        return True

    renewal = renewer("default").lease("twice", 6.0, renew=renew)
    renewal.start()
    try:
        assert third.wait(30), "no third try"
        assert not renewal.lost.is_set()
    finally:
        renewal.stop()
