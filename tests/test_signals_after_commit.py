"""Lease and claim signals tell of what committed, each once.

A transactional step's open transaction carries what the workflow does next: the next step
created and claimed, the run's completion (which releases its run lease), the next due run's
pass picked with its run lease. When that transaction never commits (its connection drops
just before the commit), none of it happened, and no receiver may have been told it did:
``step_attempt_started`` names only attempts that exist, and each (key, token) is announced
acquired, and released, at most once. Every such signal is sent after the commit, never from
inside a transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_leases import signals
from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from django_leases.workflows import step_function, workflow
from django_leases.workflows.values import RUN_LEASE_PREFIX
from django_leases.workflows.worker import Worker
from tests.helpers import tuned_sql, work_until_idle
from tests.workapp.models import LedgerEntry

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"]),
]

#: Aliases whose next commit drops the connection first (set by the step, once).
drop_at_commit: set[str] = set()


@step_function("signals-after-commit.write", transactional=True)
def write(data: Any, ctx: Any) -> dict[str, Any]:
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    if ctx.attempt == 1:
        drop_at_commit.add(ctx.using)
    return {"attempt": ctx.attempt}


@step_function("signals-after-commit.plain")
def plain(data: Any, ctx: Any) -> dict[str, Any]:
    return {"attempt": ctx.attempt}


@workflow("signals-after-commit.then-next")
def then_next(run: Any, input: Any) -> Any:
    first = run.step("write", "signals-after-commit.write", {})
    second = run.step("next", "signals-after-commit.plain", {})
    return {"write": first["attempt"], "next": second["attempt"]}


@workflow("signals-after-commit.last")
def last(run: Any, input: Any) -> Any:
    return run.step("write", "signals-after-commit.write", {})


@pytest.fixture
def commit_dropped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A commit asked for by the step's attempt 1 loses its connection first: the server
    ends the session (SQLite: the commit fails and the transaction rolls back)."""
    commit = BaseDatabaseWrapper._commit  # type: ignore[attr-defined]

    def dropping(self: BaseDatabaseWrapper) -> None:
        if self.alias not in drop_at_commit:
            commit(self)
            return
        drop_at_commit.discard(self.alias)
        if self.vendor == "sqlite":
            raise DatabaseError("the commit failed (test)")
        own = (
            "SELECT pg_terminate_backend(pg_backend_pid())"
            if self.vendor == "postgresql"
            else "KILL CONNECTION CONNECTION_ID()"
        )
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(own)
        except Exception:
            pass  # the session ended under the statement
        commit(self)

    monkeypatch.setattr(BaseDatabaseWrapper, "_commit", dropping)
    drop_at_commit.clear()
    yield
    drop_at_commit.clear()


class Heard:
    """What the lease and attempt signals said, and whether from inside a transaction."""

    def __init__(self) -> None:
        self.acquired: list[tuple[str, int]] = []
        self.released: list[tuple[str, int]] = []
        self.started: list[tuple[int, str, int]] = []
        self.inside: list[str] = []

    def lease(self, into: list[tuple[str, int]], name: str) -> Any:
        def receiver(sender: Any, lease: Any, **kwargs: Any) -> None:
            if lease.key.startswith(RUN_LEASE_PREFIX):
                into.append((lease.key, lease.token))
                self._where(lease._state.db or "default", name)

        return receiver

    def attempt(self, sender: Any, step_id: int, step_name: str, attempt: int, **kw: Any) -> None:
        self.started.append((step_id, step_name, attempt))
        self._where(kw["using"], "step_attempt_started")

    def _where(self, alias: str, name: str) -> None:
        if connections[alias].in_atomic_block:
            self.inside.append(name)


@pytest.fixture
def heard(commit_dropped: None) -> Iterator[Heard]:
    found = Heard()
    receivers = [
        (signals.lease_acquired, found.lease(found.acquired, "lease_acquired")),
        (signals.lease_released, found.lease(found.released, "lease_released")),
        (signals.step_attempt_started, found.attempt),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    yield found
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def settled(*runs: WorkflowRun) -> None:
    """Work until idle; each run completed, with one ledger row (attempt 2's)."""
    work_until_idle(Worker(step_lease_ttl=60.0))
    for run in runs:
        run.refresh_from_db()
        assert run.status == "completed", (run.status, run.error)
        assert list(LedgerEntry.objects.filter(run_id=run.id).values_list("attempt")) == [(2,)]


def test_a_claim_carried_by_a_write_that_never_committed_is_not_announced(
    tuned: bool, heard: Heard
) -> None:
    with tuned_sql(tuned):
        run = WorkflowRun.objects.start("signals-after-commit.then-next", {})
        settled(run)
    attempts = set(
        WorkflowStepAttempt.objects.filter(step__run_id=run.id).values_list("step_id", "attempt")
    )
    names = dict(WorkflowStep.objects.filter(run_id=run.id).values_list("pk", "step_name"))
    phantoms = [
        (step_id, name, attempt)
        for step_id, name, attempt in heard.started
        if (step_id, attempt) not in attempts or names.get(step_id) != name
    ]
    assert phantoms == [], f"attempts announced that never existed: {phantoms}"
    assert heard.inside == []


def test_a_run_lease_released_by_a_write_that_never_committed_is_announced_once(
    tuned: bool, heard: Heard
) -> None:
    with tuned_sql(tuned):
        run = WorkflowRun.objects.start("signals-after-commit.last", {})
        settled(run)
    assert heard.released, "the run lease's release was never announced"
    assert len(heard.released) == len(set(heard.released)), heard.released
    assert heard.inside == []


def test_a_pass_picked_by_a_write_that_never_committed_is_announced_once(
    tuned: bool, heard: Heard
) -> None:
    with tuned_sql(tuned):
        first = WorkflowRun.objects.start("signals-after-commit.last", {})
        second = WorkflowRun.objects.start("signals-after-commit.last", {})
        settled(first, second)
    assert len(heard.acquired) == len(set(heard.acquired)), heard.acquired
    assert heard.inside == []


def test_a_lease_acquired_in_a_transaction_that_rolls_back_is_not_announced(
    tuned: bool, heard: Heard
) -> None:
    """``Lease.objects.acquire`` inside the caller's own transaction: announced once it
    commits; not at all when it rolls back."""
    from django.db import transaction

    from django_leases.models import Lease

    key = f"{RUN_LEASE_PREFIX}rolled-back"
    with tuned_sql(tuned):
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            assert Lease.objects.acquire(key, "holder", 60) is not None
            1 / 0  # noqa: B018
        assert heard.acquired == []
        with transaction.atomic():
            granted = Lease.objects.acquire(key, "holder", 60)
            assert granted is not None
            assert heard.acquired == []
    assert heard.acquired == [(key, granted.token)]
