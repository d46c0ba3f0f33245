"""PostgreSQL: the run and step updates that change no indexed state are HOT updates.

A heap-only (HOT) update writes no index entry; PostgreSQL makes one only when the update
changes no indexed column (nor a column of a partial index's predicate) and the row's page
has room. A step lease renewal is one since migration ``0023_workflow_hot_updates`` (no
index on ``lease_expires_at``); a parallel branch counted off its run is one as long as no
index takes ``branches_left`` or ``pass_requests``. The fill factor of 80 the migration gives
both tables keeps the room on big tables (here every row fits one page anyway). Counted
from ``pg_stat_user_tables``, flushed on demand.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.workflows import run_pass, step_function, workflow
from django_leases.workflows.engine import start_workflow

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

#: Updates of each kind in a test, and the share of them that must be HOT.
UPDATES = 40
AT_LEAST = 0.8


@step_function("tests.hot.branch")
def branch(data: Any, ctx: Any) -> Any:
    return data


@workflow("tests.hot.fan-out")
def fan_out(run: Any, input: Any) -> Any:
    calls = [(f"b{n}", "tests.hot.branch", n) for n in range(input["n"])]
    return sum(run.parallel(calls))


def updates(table: str) -> tuple[int, int]:
    """``(updates, HOT updates)`` of ``table`` so far, this session's flushed first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:  # a new transaction: the flush happened at the last
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
            [table],
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def hot_share(table: str, before: tuple[int, int]) -> tuple[int, float]:
    done, hot = updates(table)
    count = done - before[0]
    return count, (hot - before[1]) / count if count else 0.0


def test_step_lease_renewals_are_hot() -> None:
    run_id = start_workflow("tests.hot.fan-out", {"n": 1})
    assert run_pass(run_id) == "waiting"
    claim = WorkflowStep.objects.claim_for_execution(run_id, "b0", "tests.hot.branch", 30)
    assert claim is not None
    table = WorkflowStep._meta.db_table
    before = updates(table)
    for _ in range(UPDATES):
        assert WorkflowStep.objects.refresh_lease(claim.step_id, 30, claim.attempt)
    count, share = hot_share(table, before)
    assert count == UPDATES
    assert share >= AT_LEAST, f"{share:.0%} of {count} renewals were HOT"


def test_parallel_branches_counted_off_their_run_are_hot() -> None:
    run_id: uuid.UUID = start_workflow("tests.hot.fan-out", {"n": UPDATES + 1})
    assert run_pass(run_id) == "waiting"
    claims = [
        WorkflowStep.objects.claim_for_execution(run_id, f"b{n}", "tests.hot.branch", 30)
        for n in range(UPDATES + 1)
    ]
    table = WorkflowRun._meta.db_table
    before = updates(table)
    for n, claim in enumerate(claims[:-1]):  # each counts one off; the last asks for a pass
        assert claim is not None
        WorkflowStep.objects.set_result(claim.step_id, n, claim.attempt)
    count, share = hot_share(table, before)
    assert count == UPDATES
    assert share >= AT_LEAST, f"{share:.0%} of {count} count-offs were HOT"
    assert WorkflowRun.objects.values_list("branches_left", flat=True).get(pk=run_id) == 1
