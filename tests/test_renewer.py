"""One renewer per process and database alias (issue 31, item 1).

The rules a hold keeps (L9–L18) are the conformance suite's; these tests pin what the
renewer adds: every hold of the process renewed by one thread on one connection with one
statement per tick, each holder told of its own loss only, a failed or stuck tick, the
threads ending when nothing is held, and the interface a lease with its own renew callable
(the workflow engine's, later) registers with. ``Lease.objects.refresh_many`` itself is
``tests/test_lease_refresh_many.py``'s.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import pytest
from django.db import connection

from django_leases import LeaseLostError, renewal
from django_leases.leases import HeldLease
from django_leases.models import Lease, LeaseQuerySet
from tests.helpers import (
    held_renewals,
    holds_renewed_together,
    on_another_thread,
    renewal_threads,
    unique_key,
    wait_until,
)

#: How long a wait for a renewal, a loss or a thread's end may take: generous, never a
#: timing claim.
PATIENCE = 60.0


# -- one renewer -----------------------------------------------------------------------------------


@pytest.fixture
def refresh_calls() -> Iterator[list[tuple[str, int]]]:
    """Each ``refresh_many`` call: the thread it ran on and how many leases it renewed."""
    calls: list[tuple[str, int]] = []
    real = LeaseQuerySet.refresh_many

    def counting(queryset: LeaseQuerySet, held: Sequence[tuple[Lease, float]]) -> Any:
        calls.append((threading.current_thread().name, len(held)))
        return real(queryset, held)

    with mock.patch.object(LeaseQuerySet, "refresh_many", counting):
        yield calls


@pytest.mark.django_db(transaction=True)
def test_every_hold_is_renewed_by_one_thread_with_one_statement_per_tick(
    refresh_calls: list[tuple[str, int]],
) -> None:
    count, ttl = 40, 3.0
    holds = holds_renewed_together([ttl] * count, "renewer")
    the_renewer = renewal.renewer("default")
    ticks = the_renewer.ticks
    try:
        wait_until(lambda: the_renewer.ticks >= ticks + 3, PATIENCE, what="three ticks")
        threads = [
            t.name for t in renewal_threads() if not t.name.endswith(("callables", "flight"))
        ]
        # One renewal thread and one watchdog for the alias; no thread of any hold's own.
        assert sorted(threads) == ["lease-renewer:default", "lease-watchdog:default"], threads
        renewer_calls = [n for name, n in refresh_calls if name == "lease-renewer:default"]
        assert len(renewer_calls) >= 3
        assert set(renewer_calls) == {count}, renewer_calls  # one statement: every lease
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
                assert cursor.fetchone()[0] == 1  # the renewer's one connection
        for held in holds:
            assert not held.lost.is_set()
            row = Lease.objects.get(key=held.key)
            assert (row.holder, row.token) == (held.holder, held.token)
            assert held.lease.renewed_at == row.renewed_at  # each holder sees its renewal
    finally:
        for held in holds:
            held.finish(vouch=True)
    assert not Lease.objects.filter(key__in=[h.key for h in holds], released_at=None).exists()


@pytest.mark.django_db(transaction=True)
def test_a_lease_lost_among_many_is_told_to_its_holder_alone() -> None:
    holds = holds_renewed_together([3.0] * 12, "renewer")
    victim, others = holds[5], holds[:5] + holds[6:]
    told: list[str] = []
    victim._on_lost = lambda: told.append(threading.current_thread().name)
    try:
        assert Lease.objects.release(victim.lease)
        assert Lease.objects.acquire(victim.key, "thief", 60) is not None
        assert victim.lost.wait(PATIENCE), "the loss went unnoticed"
        wait_until(lambda: told, PATIENCE, what="the holder's on_lost")
        assert told == ["lease-lost:default"]  # not on the renewer's thread
        with pytest.raises(LeaseLostError):
            victim.check()
        renewed = renewal.renewer("default").ticks
        wait_until(lambda: renewal.renewer("default").ticks > renewed, PATIENCE, what="a tick")
        assert not any(held.lost.is_set() for held in others)
    finally:
        with pytest.raises(LeaseLostError):
            victim.finish(vouch=True)
        for held in others:
            held.finish(vouch=True)  # each vouched for: no LeaseLostError
    assert Lease.objects.get(key=victim.key).holder == "thief"


@pytest.mark.django_db(transaction=True)
def test_the_renewer_s_threads_and_connection_end_when_nothing_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(renewal, "RENEWER_IDLE", 0.5)
    holds = holds_renewed_together([3.0] * 3, "renewer")
    the_renewer = renewal.renewer("default")
    ticks = the_renewer.ticks
    wait_until(lambda: the_renewer.ticks > ticks, PATIENCE, what="a tick")
    for held in holds:
        held.finish(vouch=True)
    assert all(not held_renewals(held.key) for held in holds)
    wait_until(lambda: not renewal_threads(), PATIENCE, what="the renewer's threads to end")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 0
    # And they come back with the next hold.
    (again,) = holds_renewed_together([3.0], "renewer")
    try:
        assert sorted(t.name for t in renewal_threads()) == [
            "lease-renewer:default",
            "lease-watchdog:default",
        ]
    finally:
        again.finish(vouch=True)


@pytest.mark.django_db(transaction=True)
def test_a_failed_tick_counts_for_every_lease_of_it_and_the_next_one_renews(
    refresh_calls: list[tuple[str, int]],
) -> None:
    from django.db import OperationalError

    holds = holds_renewed_together([3.0] * 5, "renewer")
    real = LeaseQuerySet.refresh_many
    failures = [1]

    def failing_once(queryset: LeaseQuerySet, held: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise OperationalError("simulated: the database went away")
        return real(queryset, held)

    the_renewer = renewal.renewer("default")
    try:
        with mock.patch.object(LeaseQuerySet, "refresh_many", failing_once):
            ticks = the_renewer.ticks
            wait_until(lambda: the_renewer.ticks >= ticks + 2, PATIENCE, what="two ticks")
        assert failures == [0]
        assert not any(held.lost.is_set() for held in holds), "one failed tick cost a lease"
        deadlines = [held.deadline for held in holds]
        assert all(d > time.monotonic() for d in deadlines)
    finally:
        for held in holds:
            held.finish(vouch=True)


# -- the interface for leases of other kinds ---------------------------------------------------


def test_a_lease_with_its_own_renew_callable_follows_the_same_rules() -> None:
    """``Renewer.lease(renew=...)``: a callable answering for one lease (what a workflow step
    lease registers until it has a set-based refresh). The renewal thread is the subject:
    short TTLs."""
    the_renewer = renewal.Renewer("callables")
    answers = {"held": True, "raises": True}
    calls: dict[str, int] = {"held": 0, "raises": 0}

    def renew(name: str) -> Any:
        def call() -> bool:
            calls[name] += 1
            if name == "raises" and calls[name] > 1:
                raise ConnectionError("unreachable")
            return answers[name]

        return call

    told: list[str] = []
    held = the_renewer.lease(
        "held", 0.6, renew=renew("held"), on_lost=lambda: told.append("held")
    ).start()
    failing = the_renewer.lease(
        "raises", 0.6, renew=renew("raises"), on_lost=lambda: told.append("raises")
    ).start()
    try:
        # A renew that raises: lost once the local deadline has passed, not before.
        assert failing.lost.wait(PATIENCE)
        assert time.monotonic() >= failing.deadline
        assert not held.lost.is_set() and calls["held"] >= 2
        # A renew that answers False: lost at once.
        answers["held"] = False
        assert held.lost.wait(PATIENCE)
        wait_until(lambda: sorted(told) == ["held", "raises"], PATIENCE, what="on_lost twice")
    finally:
        held.stop()
        failing.stop()
    with pytest.raises(ValueError, match="either refresh"):
        the_renewer.lease("neither", 1.0)


def test_stop_waits_for_a_renewal_in_flight_then_gives_up_at_the_deadline() -> None:
    the_renewer = renewal.Renewer("in-flight")
    entered, let_go = threading.Event(), threading.Event()

    def slow() -> bool:
        entered.set()
        let_go.wait(PATIENCE)
        return True

    lease = the_renewer.lease("slow", 0.6, renew=slow).start()
    assert entered.wait(PATIENCE)
    lease.stop()  # the renewal hangs past the deadline: stop gives up and counts it lost
    assert lease.lost.is_set()
    assert time.monotonic() >= lease.deadline
    let_go.set()


def test_a_stuck_tick_costs_its_own_leases_not_the_others() -> None:
    """A tick hung where no statement timeout reaches (here a renew callable that never
    returns; in life a connection attempt to a silent peer): past its bound the watchdog
    starts a new renewal thread, which renews the leases registered since; the stuck one's
    lease is lost at its deadline."""
    the_renewer = renewal.Renewer("stuck")
    entered, let_go = threading.Event(), threading.Event()

    def hangs() -> bool:
        entered.set()
        let_go.wait(PATIENCE)
        return True

    renewed: list[str] = []
    stuck = the_renewer.lease("stuck", 0.6, renew=hangs).start()
    assert entered.wait(PATIENCE)
    later = the_renewer.lease(
        "later", 6.0, renew=lambda: renewed.append(threading.current_thread().name) or True
    ).start()
    try:
        assert stuck.lost.wait(PATIENCE), "the stuck renewal's lease was never lost"
        wait_until(lambda: renewed, PATIENCE, what="a renewal of the later lease")
        assert renewed[0] == "lease-renewer:stuck"  # a new thread, not the retired one
        assert not later.lost.is_set()
        names = [t.name for t in threading.enumerate() if t.name.startswith("lease-renewer:stuck")]
        assert sorted(names) == ["lease-renewer:stuck", "lease-renewer:stuck (retired)"]
    finally:
        let_go.set()
        stuck.stop()
        later.stop()
    wait_until(
        lambda: not [t for t in threading.enumerate() if "(retired)" in t.name],
        PATIENCE,
        what="the retired thread to end once its call returned",
    )


def test_a_forked_child_gets_a_renewer_of_its_own() -> None:
    parent = renewal.renewer("default")
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()

    def child() -> None:
        queue.put(renewal.renewer("default") is parent)

    process = fork.Process(target=child)
    process.start()
    process.join(PATIENCE)
    assert queue.get(timeout=PATIENCE) is False


@pytest.mark.django_db(transaction=True)
def test_a_hold_on_another_thread_shares_the_renewer() -> None:
    key = unique_key("renewer-threads")

    def hold() -> list[str]:
        held = HeldLease(key, 30.0)
        held.acquire()
        try:
            return held_renewals(key)
        finally:
            held.finish(vouch=True)

    assert on_another_thread(hold) == ["renewer:default"]
    assert held_renewals(key) == []
