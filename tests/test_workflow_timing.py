"""Delayed starts, run deadlines and debounced starts through the engine (DESIGN §5c):
``start_workflow(..., run_after=, deadline=, debounce_key=, debounce=)``,
``run.child(..., deadline=)``, the worker that fails runs past their deadline, and
``drive()`` that jumps delayed starts and debounce windows but never deadlines. The store's
rules are pinned by ``django_leases.testing.timing`` (tests/test_timing_conformance.py)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_leases.clock import db_now_plus
from django_leases.exceptions import UnknownWorkflowError, WorkflowChildFailedError
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import RUN_CANCELLED, AttemptStatus
from django_leases.workflows.worker import Worker
from tests.helpers import drain, on_another_thread, race_in_processes, run_of, staff_client

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
DEADLINE_ERROR = "WorkflowDeadlineExceeded"


@step_function("tests.timing.echo")
def echo(data: Any, ctx: Any) -> Any:
    return data


#: Set by a test: called inside ``tests.timing.slow`` while its attempt runs.
during_step: list[Any] = []


@step_function("tests.timing.slow")
def slow(data: Any, ctx: Any) -> Any:
    for call in during_step:
        call()
    return "late"


@workflow("tests.timing.one-step")
def one_step(run: Any, input: Any) -> Any:
    return run.step("echo", "tests.timing.echo", input)


@workflow("tests.timing.waits")
def waits(run: Any, input: Any) -> Any:
    return run.wait_for_event("go")


@workflow("tests.timing.slow")
def slow_run(run: Any, input: Any) -> Any:
    return run.step("slow", "tests.timing.slow", {}, retries=3)


@workflow("tests.timing.slow-then-more")
def slow_then_more(run: Any, input: Any) -> Any:
    first = run.step("slow", "tests.timing.slow", {}, retries=3)
    return [first, run.step("more", "tests.timing.echo", {"n": 2})]


@workflow("tests.timing.parent")
def parent(run: Any, input: dict[str, Any]) -> Any:
    try:
        return run.child("kid", "tests.timing.waits", {}, deadline=input.get("deadline"))
    except WorkflowChildFailedError as exc:
        return {"child": exc.status, "type": (exc.error or {}).get("type")}


def pass_deadline(run_id: Any) -> None:
    """Move run ``run_id``'s deadline a second into the past on the database clock."""
    WorkflowRun.objects.filter(pk=run_id).update(deadline_at=db_now_plus(-1))


def failed_at_deadline(run_id: Any) -> bool:
    run = run_of(run_id)
    return run.status == RunStatus.FAILED and (run.error or {}).get("type") == DEADLINE_ERROR


# -- delayed starts -----------------------------------------------------------------------------


def test_a_delayed_start_is_not_run_before_its_time(sql_path: str) -> None:
    run_id = start_workflow("tests.timing.one-step", {"n": 1}, run_after=3600)
    assert drain() == 0, "a worker finds nothing due"
    assert run_of(run_id).status == RunStatus.RUNNING
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=db_now_plus(-1))
    drain()
    assert run_of(run_id).output == {"n": 1}


def test_drive_jumps_a_delayed_start_and_a_debounce_window() -> None:
    delayed = start_workflow("tests.timing.one-step", {"n": 1}, run_after=timedelta(days=1))
    later = timezone.now() + timedelta(days=2)
    at = start_workflow("tests.timing.one-step", {"n": 2}, run_after=later)
    debounced = start_workflow("tests.timing.one-step", {"n": 3}, debounce_key="k", debounce=600)
    assert drive(skip_sleeps=False) is None
    assert {run_of(r).status for r in (delayed, at, debounced)} == {RunStatus.RUNNING}
    drive()
    assert [run_of(r).output for r in (delayed, at, debounced)] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_timed_starts_keep_their_tags_and_queue_key_and_a_debounce_replaces_the_tags() -> None:
    """Starts through the timing options store ``tags`` and ``queue_key`` as a plain start
    does; a debounced start while its run is pending replaces the run's tags (DESIGN §5c)."""
    delayed = start_workflow(
        "tests.timing.one-step", {}, run_after=60, tags={"team": "a"}, queue_key="tenant-1"
    )
    bounded = start_workflow("tests.timing.one-step", {}, deadline=60, tags={"team": "b"})
    first = start_workflow(
        "tests.timing.one-step", {}, debounce_key="doc-1", debounce=60, tags={"v": "1"}
    )
    again = start_workflow(
        "tests.timing.one-step", {}, debounce_key="doc-1", debounce=60, tags={"v": "2"}
    )
    assert again == first
    assert run_of(delayed).queue_key == "tenant-1"
    assert list(WorkflowRun.objects.tagged(team="a").values_list("pk", flat=True)) == [delayed]
    assert list(WorkflowRun.objects.tagged(team="b").values_list("pk", flat=True)) == [bounded]
    assert run_of(first).tags == {"v": "2"}
    assert not WorkflowRun.objects.tagged(v="1").exists()
    assert list(WorkflowRun.objects.tagged(v="2").values_list("pk", flat=True)) == [first]


@pytest.mark.parametrize(
    "options",
    [
        {"run_after": -1},
        {"run_after": math.nan},
        {"deadline": 0},
        {"deadline": -1.5},
        {"deadline": math.inf},
        {"debounce": 5},
        {"debounce_key": "k"},
        {"debounce_key": "k", "debounce": math.nan},
        {"debounce_key": "k", "debounce": 5, "key": "k"},
        {"debounce_key": "k", "debounce": 5, "run_after": 0},
    ],
)
def test_bad_timing_options_are_refused_with_nothing_written(
    options: dict[str, Any], sql_path: str
) -> None:
    with pytest.raises(ValueError):
        start_workflow("tests.timing.one-step", {}, **options)
    assert not WorkflowRun.objects.exists()


@override_settings(USE_TZ=True)
def test_a_naive_datetime_is_refused_while_use_tz_is_on() -> None:
    with pytest.raises(ValueError, match="aware"):
        start_workflow("tests.timing.one-step", {}, run_after=timezone.now().replace(tzinfo=None))
    assert not WorkflowRun.objects.exists()


def test_an_unknown_workflow_writes_nothing_whatever_its_options() -> None:
    with pytest.raises(UnknownWorkflowError):
        start_workflow("tests.timing.nope", {}, debounce_key="k", debounce=5)
    assert not WorkflowRun.objects.exists()


# -- deadlines ----------------------------------------------------------------------------------


def test_a_run_past_its_deadline_is_failed_and_its_child_cancelled(sql_path: str) -> None:
    run_id = start_workflow("tests.timing.parent", {}, deadline=3600)
    drain()
    kid = WorkflowRun.objects.get(parent_id=run_id)
    assert kid.deadline_at == run_of(run_id).deadline_at, "the child inherits the deadline"
    assert (run_of(run_id).status, kid.status) == (RunStatus.RUNNING, RunStatus.RUNNING)
    pass_deadline(run_id)
    drain()
    assert failed_at_deadline(run_id)
    assert (run_of(kid.pk).status, run_of(kid.pk).error["code"]) == (
        RunStatus.CANCELLED,
        RUN_CANCELLED,
    )


def test_a_childs_own_deadline_fails_the_child_and_the_parent_hears_of_it() -> None:
    run_id = start_workflow("tests.timing.parent", {"deadline": 60})
    drive()
    kid = WorkflowRun.objects.get(parent_id=run_id)
    pass_deadline(kid.pk)
    run = drive(run_id)
    assert run is not None and run.output == {"child": "failed", "type": DEADLINE_ERROR}
    assert failed_at_deadline(kid.pk)


def test_drive_never_jumps_a_deadline() -> None:
    run_id = start_workflow("tests.timing.waits", {}, deadline=timedelta(hours=1))
    drive()
    assert run_of(run_id).status == RunStatus.RUNNING, "an hour to go: still waiting"
    pass_deadline(run_id)
    run = drive(run_id)
    assert run is not None and failed_at_deadline(run_id)


def test_an_attempt_running_at_the_deadline_has_its_late_result_refused(
    sql_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = start_workflow("tests.timing.slow", {}, deadline=3600)
    drive(run_id, until=lambda: WorkflowStep.objects.filter(run_id=run_id).exists())
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None

    def expire() -> None:  # the deadline passes while the attempt runs
        pass_deadline(run_id)
        assert WorkflowRun.objects.expire_deadlines() == [run_id]

    during_step[:] = [lambda: on_another_thread(expire)]
    try:
        execute_step(claim)  # its result write is refused by the attempt fence, quietly
    finally:
        during_step.clear()
    assert failed_at_deadline(run_id)
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert (step.status, step.result, step.error["type"]) == (
        StepStatus.FAILED,
        None,
        DEADLINE_ERROR,
    )
    [entry] = WorkflowStep.objects.history(run_id)
    assert (entry.status, entry.result) == (AttemptStatus.FAILED, None)
    assert drain() == 0, "nothing of the run is due again"


def test_a_pass_carrying_a_result_past_the_deadline_writes_nothing(sql_path: str) -> None:
    """A worker runs the step inline and carries its result into the pass, which writes it
    with the next step: the deadline passed meanwhile, so that one write is refused whole."""
    run_id = start_workflow("tests.timing.slow-then-more", {}, deadline=3600)

    def expire() -> None:
        pass_deadline(run_id)
        assert WorkflowRun.objects.expire_deadlines() == [run_id]

    during_step[:] = [lambda: on_another_thread(expire)]
    try:
        drain(Worker(step_lease_ttl=LEASE))
    finally:
        during_step.clear()
    assert failed_at_deadline(run_id)
    steps = {s.step_name: s for s in WorkflowStep.objects.filter(run_id=run_id)}
    assert list(steps) == ["slow"], "no next step was written"
    assert (steps["slow"].status, steps["slow"].result) == (StepStatus.FAILED, None)
    assert [e.status for e in WorkflowStep.objects.history(run_id)] == [AttemptStatus.FAILED]


def test_a_worker_fails_a_run_at_its_deadline_and_an_event_then_is_refused() -> None:
    run_id = start_workflow("tests.timing.waits", {}, deadline=3600)
    worker = Worker(step_lease_ttl=LEASE, poll_interval=0)  # looks at every unit
    drain(worker)
    pass_deadline(run_id)
    assert worker.work_once() is True, "the worker's look for deadlines"
    assert failed_at_deadline(run_id)
    with pytest.raises(ValueError):
        send_event(run_id, "go", {})


def test_a_finished_run_is_never_failed_by_its_deadline(sql_path: str) -> None:
    run_id = start_workflow("tests.timing.one-step", {"n": 5}, deadline=3600)
    drain()
    pass_deadline(run_id)
    assert WorkflowRun.objects.expire_deadlines() == []
    assert run_of(run_id).output == {"n": 5}


# -- debounced starts ---------------------------------------------------------------------------


def test_a_debounced_start_replaces_the_pending_input_and_then_starts_afresh(
    sql_path: str,
) -> None:
    first = start_workflow("tests.timing.one-step", {"n": 1}, debounce_key="user-7", debounce=60)
    again = start_workflow("tests.timing.one-step", {"n": 2}, debounce_key="user-7", debounce=60)
    assert again == first
    assert drain() == 0, "the window is open"
    drive()
    assert run_of(first).output == {"n": 2}, "the latest input ran, once"
    fresh = start_workflow("tests.timing.one-step", {"n": 3}, debounce_key="user-7", debounce=60)
    assert fresh != first
    assert WorkflowRun.objects.count() == 2


def test_eight_processes_debouncing_at_once_make_one_run(sql_path: str) -> None:
    def start(n: int) -> str:
        run_id = start_workflow(
            "tests.timing.one-step", {"n": n}, debounce_key="raced", debounce=600
        )
        return str(run_id)

    outcomes = race_in_processes(*(lambda n=n: start(n) for n in range(8)))
    errors = [error for _, error in outcomes if error]
    assert not errors, "\n\n".join(errors)  # a str: printed whole
    assert len({value for value, _ in outcomes}) == 1
    assert WorkflowRun.objects.count() == 1
    assert WorkflowRun.objects.get().debounce_key == "raced"


def test_the_run_page_shows_the_deadline_and_the_debounce_key() -> None:
    run_id = start_workflow("tests.timing.one-step", {}, debounce_key="doc-9", debounce=60)
    start_workflow("tests.timing.one-step", {}, deadline=60)
    client = staff_client("view_workflowrun")
    page = client.get(reverse("admin:django_leases_workflowrun_change", args=[run_id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Debounce key" in text and "doc-9" in text
    assert "Deadline" in text
