"""``manage.py hold_lease`` SIGSTOPped past its TTL: whatever the child did
meanwhile, a holder that was stopped past the lease must not vouch for the run (exit 76),
and must never release or renew a lease granted to someone else meanwhile."""

from __future__ import annotations

import signal
import sys

import pytest

from django_leases.holder import EXIT_LOST
from django_leases.models import Lease, LeaseState
from tests.helpers import lapse_lease, process_stopped, wait_until
from tests.hold_command import (
    PATIENCE,
    TTL,
    Holders,
    lease_row,
    pid_alive,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


@pytest.mark.parametrize("intruder", [True, False], ids=["taken", "lapsed-only"])
def test_child_that_finished_while_its_holder_was_stopped_past_the_ttl_is_not_vouched_for(
    holders: Holders,
    intruder: bool,
) -> None:
    """The child exits 0 while the holder is stopped; the lease lapses (and maybe is
    taken). On SIGCONT the holder cannot vouch: exit 76; the intruder keeps its lease."""
    key = f"hold-cmd:stopped-holder-{intruder}"
    holder = holders.start(key, "--ttl", str(TTL), "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    holder.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: process_stopped(holder.pid), PATIENCE, what="the holder to stop")
        holders.finish("a")
        wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the child to end")
        lapse_lease(key)
        other = Lease.objects.acquire(key, "intruder", ttl=120) if intruder else None
    finally:
        holder.send_signal(signal.SIGCONT)
    assert holder.wait(timeout=PATIENCE) == EXIT_LOST, holders.log(holder)
    row = lease_row(key)
    if other is not None:
        assert row.state == LeaseState.LIVE
        assert (row.holder, row.token) == ("intruder", other.token)
    else:
        assert row.state != LeaseState.LIVE
        assert row.token == int(a["token"])


def test_holder_stopped_briefly_within_its_ttl_carries_on(
    holders: Holders,
) -> None:
    """A SIGSTOP shorter than the TTL (a renewal due meanwhile) costs nothing: the
    holder renews on SIGCONT and exits 0 with the lease released."""
    key = "hold-cmd:stopped-briefly"
    holder = holders.start(key, "--ttl", "30", "--", *holders.child("a", "--hold"))
    holders.info("a")
    before = lease_row(key).renewed_at
    holder.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: process_stopped(holder.pid), PATIENCE, what="the holder to stop")
    finally:
        holder.send_signal(signal.SIGCONT)
    wait_until(lambda: lease_row(key).renewed_at > before, PATIENCE, what="a renewal")
    holders.finish("a")
    assert holder.wait(timeout=PATIENCE) == 0, holders.log(holder)
    assert lease_row(key).state == LeaseState.RELEASED


def test_sigterm_sent_while_stopped_past_the_ttl_then_taken(
    holders: Holders,
) -> None:
    """SIGTERM arrives while the holder is stopped; the lease is lapsed and taken.
    On SIGCONT: the child is stopped, the holder exits 76 (lost, not the child's 42), and
    the intruder's lease is untouched."""
    key = "hold-cmd:stopped-term"
    holder = holders.start(key, "--ttl", str(TTL), "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    holder.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: process_stopped(holder.pid), PATIENCE, what="the holder to stop")
        holder.send_signal(signal.SIGTERM)
        lapse_lease(key)
        other = Lease.objects.acquire(key, "intruder", ttl=120)
        assert other is not None
    finally:
        holder.send_signal(signal.SIGCONT)
    assert holder.wait(timeout=PATIENCE) == EXIT_LOST, holders.log(holder)
    wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the child to stop")
    row = lease_row(key)
    assert (row.holder, row.token, row.state) == ("intruder", other.token, LeaseState.LIVE)
