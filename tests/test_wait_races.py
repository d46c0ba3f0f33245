"""Durable waits under concurrency (DESIGN §5a): an event kept for a name the run has not
reached yet, and two passes of one run (one of them stale) reaching that name at once."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from django_leases.models import WorkflowRun, WorkflowWait
from django_leases.workflows import send_event, workflow
from django_leases.workflows.values import WaitKind
from tests.helpers import start_blocked

pytestmark = pytest.mark.django_db(transaction=True)


@workflow("tests.wait-races.kid")
def kid(run: Any, input: Any) -> Any:
    return input


@workflow("tests.wait-races.parent")
def parent(run: Any, input: Any) -> Any:
    return run.child("kid", "tests.wait-races.kid", input)


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite takes its write lock before any read"
)
def test_two_passes_reaching_a_child_named_like_a_kept_event_start_one_child() -> None:
    """``start_child``: on first reach the child run and its wait are created in one
    transaction; later, the wait is found. Two passes of one run (a stale one and its
    successor) reaching ``run.child("kid")`` at once start **one** child run — also when an
    event named ``"kid"`` was sent before the run got there (kept, then dropped for the
    child): a second child run would run the child's work again, read by no wait."""
    run_id = WorkflowRun.objects.start("tests.wait-races.parent", {"n": 1}).id
    send_event(run_id, "kid", {"early": True})  # kept: the run has not reached "kid"
    store = WorkflowWait.objects
    with transaction.atomic():
        # The first pass's transaction holds the parent's row, as start_child locks it.
        WorkflowRun.objects.select_for_update().get(pk=run_id)
        second = start_blocked(
            lambda: store.start_child(run_id, "kid", "tests.wait-races.kid", {"n": 1})
        )
        assert second.waited
        first = store.start_child(run_id, "kid", "tests.wait-races.kid", {"n": 1})
    # The later pass finds the wait the first one made, as a pass reaching it later does.
    assert second.result().child_id == first.child_id
    wait = store.get(run_id=run_id, name="kid")
    assert (wait.kind, wait.child_id) == (WaitKind.CHILD, first.child_id)
    children = list(WorkflowRun.objects.filter(parent_id=run_id).values_list("pk", flat=True))
    assert children == [first.child_id], f"{len(children)} child runs started for one wait"
