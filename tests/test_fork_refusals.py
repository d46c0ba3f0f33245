"""A refused fork is a clear error everywhere (``ValueError`` / ``CommandError`` / an admin
message, never a traceback or a 500) and writes nothing; a fork of a suspended run or of a
fork is a run of its own (docs/howto/operators.md "Fork a run from a step")."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import fork_run, start_workflow, step_function, workflow
from django_leases.workflows.engine import StepContext
from tests.helpers import run_of, staff_client

pytestmark = pytest.mark.django_db

CALLS: list[str] = []


@step_function("tests.forkrefuse.echo")
def echo(data: Any, ctx: StepContext) -> Any:
    CALLS.append(ctx.step_name)
    return ctx.step_name


@workflow("tests.forkrefuse.two")
def two(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.forkrefuse.echo", {}, retries=0)
    if run.patched("p"):
        run.sleep("nap", 0)
    return [first, run.step("second", "tests.forkrefuse.echo", {}, retries=0)]


@workflow("tests.forkrefuse.missing")
def missing(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.forkrefuse.echo", {}, retries=0)
    return [first, run.step("gone", "tests.forkrefuse.not-registered", {}, retries=0)]


def _completed() -> Any:
    run_id = start_workflow("tests.forkrefuse.two", {})
    assert drive(run_id).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    return run_id


@pytest.mark.parametrize("name", ["x" * 201, "", "nap", "p", "first\x00"])
def test_a_bad_from_step_is_refused_by_the_api_the_command_and_the_admin_writing_nothing(
    name: str,
) -> None:
    """Over-long, empty, a wait's name, a patch's name, a NUL: ``ValueError`` from the API,
    ``CommandError`` from ``workflow_runs fork``, a message (302) from the admin form, and
    no run or step written."""
    original = _completed()
    runs, steps = WorkflowRun.objects.count(), WorkflowStep.objects.count()
    with pytest.raises(ValueError):
        fork_run(original, from_step=name)
    with pytest.raises(CommandError):
        call_command(
            "workflow_runs", "fork", str(original), "--from-step", name,
            stdout=StringIO(), stderr=StringIO(),
        )  # fmt: skip
    client = staff_client("view_workflowrun", "operate_workflowrun", raise_request_exception=False)
    url = reverse("admin:django_leases_workflowrun_operate", args=[original, "fork"])
    assert client.post(url, {"step": name}).status_code == 302
    assert (WorkflowRun.objects.count(), WorkflowStep.objects.count()) == (runs, steps)


def test_a_fork_of_a_fork_reads_only_its_own_original() -> None:
    """A fork of a fork copies what the fork recorded (the patch answer and the sleep
    included), its ``forked_from`` is the fork, and neither earlier run is written."""
    original = _completed()
    first = fork_run(original, from_step="second")
    assert drive(first).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    before = list(WorkflowStep.objects.exclude(run_id__in=[]).values_list("id", "status", "result"))
    CALLS.clear()
    second = fork_run(first, from_step="second")
    assert run_of(second).forked_from_id == first
    assert drive(second).output == ["first", "second"]  # type: ignore[union-attr]
    assert CALLS == ["second"]
    after = WorkflowStep.objects.exclude(run_id=second).values_list("id", "status", "result")
    assert sorted(after) == sorted(before)


def test_a_fork_of_a_suspended_run_leaves_the_original_suspended() -> None:
    """The original is suspended on a step function the code lacks; a fork from that step
    is suspended at it in turn, and the original is not touched (still suspended)."""
    original = start_workflow("tests.forkrefuse.missing", {})
    assert drive(original).status == RunStatus.SUSPENDED  # type: ignore[union-attr]
    fork = fork_run(original, from_step="gone")
    CALLS.clear()
    assert drive(fork).status == RunStatus.SUSPENDED  # type: ignore[union-attr]
    assert CALLS == []  # "first" replayed from the copy
    assert run_of(original).status == RunStatus.SUSPENDED
    assert WorkflowStep.objects.get(run_id=fork, step_name="first").status == StepStatus.SUCCEEDED
