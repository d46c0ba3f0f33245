"""A run that ends while its fan-out's branches wait to be claimed — cancelled by an operator,
failed at its deadline, or cancelled with its parent — runs none of those branches afterwards;
its ends stay readable (admin page, ``workflow_runs show``) and a prune takes the family whole."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_leases.clock import db_now_plus
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from tests.helpers import drain, run_of

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _calls() -> Any:
    CALLS.clear()
    yield


@step_function("tests.ended-branches.work")
def work(data: dict[str, Any], ctx: Any) -> Any:
    CALLS.append(data["name"])
    return data["name"]


@workflow("tests.ended-branches.fan")
def fan(run: Any, input: Any) -> Any:
    calls = [(n, "tests.ended-branches.work", {"name": n}) for n in ("a", "b", "c")]
    return run.parallel(calls, retries=2)


@workflow("tests.ended-branches.parent")
def parent(run: Any, input: Any) -> Any:
    return run.child("kid", "tests.ended-branches.fan", {})


def test_a_cancelled_run_runs_none_of_its_scheduled_branches() -> None:
    """Rule: no step of a cancelled run is claimed again."""
    run_id = start_workflow("tests.ended-branches.fan", {})
    assert run_pass(run_id) == "waiting"
    assert WorkflowStep.objects.filter(run_id=run_id).count() == 3
    WorkflowRun.objects.cancel(run_id)
    drain()
    assert CALLS == []
    assert run_of(run_id).status == RunStatus.CANCELLED


def test_a_run_failed_at_its_deadline_runs_none_of_its_scheduled_branches() -> None:
    """Rule: a run failed at its deadline takes its waiting steps out of the due work."""
    run_id = start_workflow("tests.ended-branches.fan", {}, deadline=3600)
    assert run_pass(run_id) == "waiting"
    WorkflowRun.objects.filter(pk=run_id).update(deadline_at=db_now_plus(-1))
    assert WorkflowRun.objects.expire_deadlines() == [run_of(run_id).pk]
    drain()
    run = run_of(run_id)
    assert CALLS == []
    assert (run.status, run.branches_left) == (RunStatus.FAILED, 0)
    assert run.error["type"] == "WorkflowDeadlineExceeded"


def test_a_parents_cancel_stops_its_childs_fan_out_and_the_family_stays_readable_then_prunes(
    admin_client: Any,
) -> None:
    """Rule: cancelling a parent cancels its child mid fan-out (none of the child's branches
    runs after), the parent's admin page and ``workflow_runs show`` render both, and a prune
    deletes parent and child with their steps and waits."""
    run_id = start_workflow("tests.ended-branches.parent", {})
    assert run_pass(run_id) == "waiting"
    kid = WorkflowRun.objects.get(parent_id=run_id)
    assert run_pass(kid.pk) == "waiting"
    WorkflowRun.objects.cancel(run_id)
    drain()
    assert CALLS == []
    assert run_of(kid.pk).status == RunStatus.CANCELLED
    change = "admin:django_leases_workflowrun_change"
    for pk in (run_id, kid.pk):
        page = admin_client.get(reverse(change, args=[pk]))
        assert page.status_code == 200
        out = StringIO()
        call_command("workflow_runs", "show", str(pk), "--format", "json", stdout=out)
        assert json.loads(out.getvalue())["status"] == "cancelled"
    WorkflowRun.objects.filter(pk__in=[run_id, kid.pk]).update(finished_at=db_now_plus(-86400 * 40))
    assert WorkflowRun.objects.prune(30 * 86400) == 2
    assert not WorkflowStep.objects.filter(run_id__in=[run_id, kid.pk]).exists()
    assert not WorkflowWait.objects.filter(run_id__in=[run_id, kid.pk]).exists()
