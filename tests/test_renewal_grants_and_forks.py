"""The process's renewer with two grants of one key, and across forks.

A hold that lapsed and was taken over by another hold of the same process is renewed in one
statement beside its successor: each grant gets its own answer and its own TTL, so the lapsed
one is told it is lost. A child forked inside a hold holds nothing: leaving the block it
neither releases the parent's lease nor waits on the parent's renewer, it gets a renewer of
its own whatever another thread held at the fork, and collecting its copy of the parent's
renewal connection does not end the parent's session."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from django.db import connection

from django_leases import renewal
from django_leases.clock import db_now_plus
from django_leases.leases import HeldLease, hold_lease
from django_leases.models import Lease
from django_leases.renewal import UNKNOWN
from tests.helpers import holds_renewed_together, lapse_lease, unique_key, wait_until

PATIENCE = 60.0


# -- refresh_many: one answer per grant, never another grant's -------------------------------


@pytest.mark.django_db(transaction=True)
def test_refresh_many_does_not_vouch_for_a_lapsed_grant_by_its_successors_key() -> None:
    """The old grant of a key (lapsed, then taken over by a new holder) and the new grant
    renewed in one statement: the old one is no longer held and must be answered ``None``,
    whatever the new one's answer. (Both are in one batch when one process held the key,
    lost it to a lapse and took it again before the renewer saw the loss.)"""
    key = unique_key("renewal-successor")
    old = Lease.objects.acquire(key, "old-holder", 30)
    assert old is not None
    lapse_lease(key)
    new = Lease.objects.acquire(key, "new-holder", 30)
    assert new is not None and new.token != old.token

    answers = Lease.objects.refresh_many([(old, 30.0), (new, 30.0)])

    assert answers[1] is not None and answers[1] is not UNKNOWN
    assert answers[0] is None, f"the lapsed grant was answered {answers[0]!r} (held)"


@pytest.mark.django_db(transaction=True)
def test_refresh_many_gives_each_grant_of_a_key_its_own_ttl() -> None:
    """Each ``(lease, ttl)`` is extended by its own TTL. A lapsed grant (TTL 60 s) and its
    successor on the same key (TTL 3 s) in one call: the successor must not be extended
    by the lapsed grant's 60 s (a crashed successor would keep the key 20 times longer)."""
    key = unique_key("renewal-ttl")
    old = Lease.objects.acquire(key, "old-holder", 60)
    assert old is not None
    lapse_lease(key)
    new = Lease.objects.acquire(key, "new-holder", 3)
    assert new is not None

    Lease.objects.refresh_many([(old, 60.0), (new, 3.0)])

    row = Lease.objects.get(key=key)
    assert row.token == new.token
    # On the database clock: the 3 s lease must not expire 30 s or more from now.
    assert not Lease.objects.filter(key=key, expires_at__gt=db_now_plus(30)).exists(), (
        f"the 3 s lease was extended to {row.expires_at} (the lapsed grant's 60 s TTL)"
    )


# -- the renewer: each holder told of its own loss ---------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_lapsed_hold_is_told_lost_though_its_successor_in_the_process_shares_its_tick() -> None:
    """One process held ``key``, the lease lapsed (on the database clock) and another hold
    of the same process took the key over before the renewer saw the loss. The two holds
    are renewed in one tick from then on: the first must still be told of its loss (its
    ``lost`` event, ``check()``), not be vouched for by its successor's renewal."""
    key = unique_key("renewal-successor-hold")
    first = HeldLease(key, 3.0)
    first.acquire(renew=False)
    lapse_lease(key)
    second = HeldLease(key, 3.0)
    second.acquire(renew=False)
    assert second.token != first.token
    # Registered together: their renewals are due together, so they share every tick.
    first.start_renewing()
    second.start_renewing()
    the_renewer = renewal.renewer("default")
    ticks = the_renewer.ticks
    try:
        wait_until(lambda: the_renewer.ticks >= ticks + 4, PATIENCE, what="four ticks")
        assert not second.lost.is_set()
        assert first.lost.is_set(), (
            "the lapsed hold was never told of its loss; check() passes while another "
            f"holder has the key (token {second.token} vs its {first.token})"
        )
    finally:
        second.finish(vouch=False)
        first.finish(vouch=False)


# -- fork ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_forked_children_that_collect_garbage_leave_the_parents_renewals_alone(
    renewal_outcomes: list[str],
) -> None:
    """A process holding leases forks children (a job runner forking one per job, a
    prefork pool) that run Python: their garbage collector frees what the parent's renewal
    thread left in the child's copy of memory. That must not close the parent's renewal
    connection. Here a child is forked after each tick, for longer than the TTL: the
    parent's leases must survive, and its renewals succeed."""
    import gc

    from django.db import connections

    from tests.helpers import in_processes

    def child() -> bool:
        gc.collect()
        return True

    holds = holds_renewed_together([3.0, 3.0], "renewal-fork")
    the_renewer = renewal.renewer("default")
    try:
        ticks = the_renewer.ticks
        wait_until(lambda: the_renewer.ticks > ticks, PATIENCE, what="a tick")
        del renewal_outcomes[:]
        for _ in range(5):  # five ticks: 5 s, past the 3 s TTL
            before = the_renewer.ticks
            assert in_processes([child]) == [(True, "")]

            def ticked(before: int = before) -> bool:
                return the_renewer.ticks > before

            wait_until(ticked, PATIENCE, what="a tick")
        lost = [held.key for held in holds if held.lost.is_set()]
        assert not lost, f"the parent lost {lost}; its renewals after the forks: {renewal_outcomes}"
        assert "failed" not in renewal_outcomes, (
            f"the parent's renewals after the forks: {renewal_outcomes}"
        )
    finally:
        connections.close_all()
        for held in holds:
            if not held.lost.is_set():
                held.finish(vouch=True)
            else:
                held.finish(vouch=False)


@pytest.mark.django_db(transaction=True)
def test_a_forked_child_leaving_the_parents_hold_neither_hangs_nor_releases_its_lease() -> None:
    """``os.fork()`` inside a hold's body: the child does its part and ends with
    ``sys.exit()``, which unwinds the ``with`` block it inherited. The lease is the
    parent's (the child never renews it): the child must not release it while the parent
    still holds and renews it, nor hang on the parent renewer's locks copied by the fork."""
    import faulthandler
    import sys

    from django.db import connections

    key = unique_key("renewal-fork-exit")
    connections.close_all()
    pid = -1
    try:
        with hold_lease(key, ttl=30) as held:
            connections.close_all()  # no connection shared across the fork
            pid = os.fork()
            if pid == 0:  # the child: done with its part
                # A child stuck on its way out ends with exit code 1 after 20 s.
                faulthandler.dump_traceback_later(20, exit=True)
                sys.exit(0)  # leaves the with block on its way out
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            row = Lease.objects.get(key=key)
            released = row.released_at is not None
            assert (code, released) == (0, False), (
                f"the forked child {'hung (deadlocked) leaving' if code else 'left'} the with "
                f"block{' and released' if released else ', leaving'} the parent's lease"
            )
            held.check()
    except BaseException:
        if pid == 0:
            os._exit(0)  # the child ends here, never back in pytest
        raise
    finally:
        if pid == 0:
            os._exit(0)


def test_a_fork_while_another_thread_looks_up_a_renewer_leaves_the_child_a_renewer() -> None:
    """A fork made while another thread is inside ``renewer()`` (holding its lock, as a
    hold acquired on another thread does for a moment): the child must still get a
    renewer of its own, not hang on a lock whose owner did not survive the fork."""
    from tests.helpers import in_processes

    taken = threading.Event()
    done = threading.Event()

    def hold_the_lock() -> None:
        with renewal._renewers_lock:
            taken.set()
            done.wait(PATIENCE)

    thread = threading.Thread(target=hold_the_lock, daemon=True)
    thread.start()
    try:
        assert taken.wait(PATIENCE)

        def child() -> str:
            found: list[Any] = []
            look = threading.Thread(target=lambda: found.append(renewal.renewer("default")))
            look.daemon = True
            look.start()
            look.join(10)
            return "got one" if found else "hung"

        assert in_processes([child]) == [("got one", "")]
    finally:
        done.set()
        thread.join(PATIENCE)


@pytest.mark.django_db(transaction=True)
def test_the_renewal_connection_killed_costs_no_lease_and_leaves_one_renewer(
    renewal_outcomes: list[str],
) -> None:
    """The renewer's backend killed (``pg_terminate_backend`` / ``KILL CONNECTION``, as a
    failover or an operator does): one failed tick at most, the leases survive, the next
    ticks renew them on a new connection, and still one renewal thread and one watchdog."""
    from tests.helpers import renewal_threads, terminate_other_backends

    if connection.vendor == "sqlite":
        pytest.skip("no server connection to kill")
    holds = holds_renewed_together([3.0, 3.0, 60.0], "renewal-fork")
    the_renewer = renewal.renewer("default")
    try:
        ticks = the_renewer.ticks
        wait_until(lambda: the_renewer.ticks > ticks, PATIENCE, what="a tick")
        assert terminate_other_backends() >= 1
        ticks = the_renewer.ticks
        wait_until(lambda: the_renewer.ticks >= ticks + 4, PATIENCE, what="four ticks")
        assert not any(held.lost.is_set() for held in holds)
        assert renewal_outcomes[-1] == "held"
        names = sorted(t.name for t in renewal_threads())
        assert names == ["lease-renewer:default", "lease-watchdog:default"], names
    finally:
        for held in holds:
            held.finish(vouch=True)
