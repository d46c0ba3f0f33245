"""The process's timer thread (``process.TIMERS``): a cancelled timer leaves the queue at once
(issue 31, item 3: cancelled renewal timers stayed queued until their moment, ~11 KiB per run
in a busy worker)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_leases import renewal
from django_leases.models import Lease
from django_leases.process import TIMERS, Timers
from tests.helpers import end_renewers, unique_key, wait_until

PATIENCE = 60.0


def test_a_cancelled_timer_leaves_the_queue_at_once() -> None:
    timers = Timers()
    ran: list[int] = []
    later = [timers.at(time.monotonic() + 600, lambda n=n: ran.append(n)) for n in range(5)]
    soon = timers.at(time.monotonic() + 0.01, lambda: ran.append(-1))
    assert timers.queued() >= 5
    for timer in later:
        timer.cancel()
    wait_until(lambda: ran == [-1], PATIENCE, what="the live timer to run")
    assert timers.queued() == 0, "cancelled timers stay queued until their moment"
    soon.cancel()  # once run: a no-op
    assert timers.queued() == 0


@pytest.mark.django_db(transaction=True)
def test_renewed_leases_and_bounded_statements_leave_no_timer_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_leases import db

    before = TIMERS.queued()
    renewer = renewal.Renewer("timers")
    for _ in range(20):
        step = renewer.lease(unique_key("deferred"), 30.0, renew=lambda: True)
        step.start()
        step.stop()
        with db.bounded(connection, 30.0, "a quick statement"):
            Lease.objects.filter(pk=-1).exists()
    assert TIMERS.queued() <= before
    end_renewers(monkeypatch, renewer)
