"""A row locked by another transaction costs the renewal of its own lease only (issue 31).

The renewer renews every lease of the process (and every step lease) in one statement per
tick: were that statement to wait for a locked row, every other lease of the process would
wait with it and risk lapsing. It skips a locked row instead (``SKIP LOCKED``) and counts
that lease's renewal as failed: its local deadline rules, as for a renewal that raised.

* a lease row locked by a ``Lease.objects.fenced()`` block: the other leases are renewed
  past their TTL meanwhile, the locked one is renewed again once the block ends, and lost
  only if it stays locked past its own TTL;
* a step row locked by a transactional step's ``fenced_update`` (MariaDB's REPEATABLE READ
  locks the step row its ``EXISTS`` reads until the step commits; on PostgreSQL the step
  locks its row itself): the other steps' leases are renewed meanwhile.

SQLite locks the whole database, never one row: nothing to skip there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import QuerySet

from django_leases import LeaseLostError
from django_leases.clock import DbNow
from django_leases.models import Lease, StepStatus, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import end_renewers, holds_renewed_together, start_thread, wait_until
from tests.workapp.models import Account

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite locks the whole database, not rows: no row to skip",
    ),
]

#: How long a wait for a renewal, a loss or a thread may take: generous, never a timing claim.
PATIENCE = 60.0


@pytest.fixture(autouse=True)
def renewers_ended(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield
    end_renewers(monkeypatch)


def _db_clock_past(rows: QuerySet[Any], moment: datetime) -> bool:
    """Whether the database clock has passed ``moment`` (read beside ``rows``, not empty)."""
    return rows.annotate(now=DbNow()).filter(now__gt=moment).exists()


def _live(lease: Lease) -> bool:
    """Whether ``lease`` (its key, holder and token) is live on the database clock."""
    return Lease.objects.filter(
        pk=lease.pk,
        holder=lease.holder,
        token=lease.token,
        released_at__isnull=True,
        expires_at__gt=DbNow(),
    ).exists()


class LockedRow:
    """A ``Lease.objects.fenced(lease)`` block held open on a thread of its own (its own
    connection) until :meth:`end`: the lease row stays locked meanwhile."""

    def __init__(self, lease: Lease) -> None:
        self._locked, self._end = threading.Event(), threading.Event()

        def hold() -> None:
            with Lease.objects.fenced(lease):
                self._locked.set()
                self._end.wait(PATIENCE)

        self._thread = start_thread(hold, name="row-locker")
        assert self._locked.wait(PATIENCE), "the row was never locked"

    def end(self) -> None:
        self._end.set()
        self._thread.join(PATIENCE)


def test_a_locked_lease_row_holds_up_no_other_lease_s_renewal(
    sql_path: str, renewal_outcomes: list[str]
) -> None:
    # The locked lease's TTL outlasts the lock: skipped, not lost.
    locked, *others = holds_renewed_together([12.0, 3.0, 3.0, 3.0], "locks")
    try:
        renewed = locked._renewal
        assert renewed is not None
        row = LockedRow(locked.lease)
        try:
            # The locked lease's renewal comes due (and is sent, or waits for the row).
            due = renewed.due
            wait_until(
                lambda: renewed.due > due or renewed.in_flight,
                PATIENCE,
                what="a renewal of the locked lease",
            )
            # Each other lease's expiry as of now: while the row stays locked, the database
            # clock passes them all. Were the renewal waiting for the row, they would lapse.
            expiries = [Lease.objects.get(pk=held.lease.pk).expires_at for held in others]
            wait_until(
                lambda: _db_clock_past(Lease.objects.all(), max(expiries)),
                PATIENCE,
                what="the others' expiry",
            )
            assert all(_live(held.lease) for held in others), "a locked row stalled the others"
            assert not any(held.lost.is_set() for held in others)
            wait_until(
                lambda: "skipped" in renewal_outcomes, PATIENCE, what="the locked lease's renewal"
            )
            assert not locked.lost.is_set()
        finally:
            row.end()
        # Unlocked: renewed again at its next tick.
        last = Lease.objects.get(pk=locked.lease.pk).renewed_at
        wait_until(
            lambda: Lease.objects.get(pk=locked.lease.pk).renewed_at > last,
            PATIENCE,
            what="a renewal of the unlocked lease",
        )
        assert not locked.lost.is_set() and _live(locked.lease)
    finally:
        for held in (locked, *others):
            held.finish(vouch=True)


def test_a_lease_row_locked_past_its_ttl_is_lost_alone(renewal_outcomes: list[str]) -> None:
    locked, *others = holds_renewed_together([3.0, 3.0, 3.0], "locks")
    try:
        row = LockedRow(locked.lease)
        try:
            assert locked.lost.wait(PATIENCE), "a lease left unrenewed past its TTL kept on"
            assert "skipped" in renewal_outcomes
            assert not any(held.lost.is_set() for held in others)
            assert all(_live(held.lease) for held in others)
        finally:
            row.end()
    finally:
        with pytest.raises(LeaseLostError):
            locked.finish(vouch=True)
        for held in others:
            held.finish(vouch=True)


# -- step rows -----------------------------------------------------------------------------------

#: The step lease of the steps below, seconds (renewed every second).
STEP_TTL = 3.0

_release = threading.Event()
_started: dict[str, Any] = {}
_guard = threading.Lock()


@step_function("tests.locks-tx", transactional=True)
def locking(data: Any, ctx: Any) -> str:
    """Transactional: a fenced write, then its step row read-locked until the step commits
    — the shared lock MariaDB's REPEATABLE READ takes on the row the write's ``EXISTS``
    reads where the server keeps a binary log (without one it reads a snapshot: the lock is
    taken here by hand, as on PostgreSQL) — then wait."""
    Account.objects.filter(name=data["key"]).fenced_update(ctx.fence, balance=1)
    table = connection.ops.quote_name(WorkflowStep._meta.db_table)
    share = "LOCK IN SHARE MODE" if connection.vendor == "mysql" else "FOR SHARE"
    mine = WorkflowStep.objects.get(run_id=ctx.run_id, step_name=ctx.step_name).pk
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s {share}", [mine])
    assert transaction.get_connection().in_atomic_block
    with _guard:
        _started[data["key"]] = ctx
    _release.wait(PATIENCE)
    return "written"


@step_function("tests.locks-slow")
def slow(data: Any, ctx: Any) -> str:
    with _guard:
        _started[data["key"]] = ctx
    _release.wait(PATIENCE)
    return "done"


@workflow("tests.locks")
def locks_workflow(run: Any, input: Any) -> Any:
    return run.step("only", input["step"], {"key": input["key"]})


def test_a_step_row_locked_by_its_transactional_step_holds_up_no_other_step_lease(
    sql_path: str,
    renewal_outcomes: list[str],
) -> None:
    _release.clear()
    _started.clear()
    Account.objects.create(name="tx")
    slow_runs = [
        start_workflow("tests.locks", {"step": "tests.locks-slow", "key": f"s{n}"})
        for n in range(2)
    ]
    worker = Worker(concurrency=3, poll_interval=0.05, step_lease_ttl=STEP_TTL)
    runner = start_thread(lambda: worker.run(handle_signals=False))
    try:
        wait_until(lambda: len(_started) == 2, PATIENCE, what="the slow steps to start")
        start_workflow("tests.locks", {"step": "tests.locks-tx", "key": "tx"})
        wait_until(lambda: "tx" in _started, PATIENCE, what="the transactional step's write")
        steps = WorkflowStep.objects.filter(run_id__in=slow_runs)
        expiries = list(steps.values_list("lease_expires_at", flat=True))
        wait_until(
            lambda: _db_clock_past(steps, max(expiries)),
            PATIENCE,
            what="the others' expiry",
        )
        held = steps.filter(status=StepStatus.RUNNING, attempt=1, lease_expires_at__gt=DbNow())
        assert held.count() == 2, "a locked step row stalled the other steps' renewals"
        assert not any(_started[key].lease_lost.is_set() for key in ("s0", "s1"))
        wait_until(
            lambda: "skipped" in renewal_outcomes, PATIENCE, what="the locked step's renewal"
        )
    finally:
        _release.set()
        worker.stop()
        runner.join(PATIENCE)
