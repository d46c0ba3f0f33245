"""How runs end, and how operators change them while work is in flight: child runs, cancels,
deadlines (a run driven step after step on one thread included), resume / retry / fork /
send-event racing a worker or each other, no orphaned child, and the signals each sends
exactly once. Ordered with events, barriers and the database clock (never sleeps)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_leases import signals
from django_leases.clock import db_now_plus
from django_leases.exceptions import (
    WorkflowChildFailedError,
    WorkflowRunStateError,
)
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.workflows import fork_run, start_workflow, step_function, workflow
from django_leases.workflows.values import RUN_CANCELLED
from django_leases.workflows.worker import Worker
from tests.helpers import drain, race, run_of, start_thread

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0

# -- gates: a step that blocks until the test lets it go -----------------------------------

_entered: dict[str, threading.Event] = {}
_release: dict[str, threading.Event] = {}
_calls: Counter[str] = Counter()


def gate(name: str) -> tuple[threading.Event, threading.Event]:
    _entered[name] = threading.Event()
    _release[name] = threading.Event()
    return _entered[name], _release[name]


@step_function("tests.run_endings.gated")
def gated(data: dict[str, Any], ctx: Any) -> Any:
    name = data["gate"]
    _calls[name] += 1
    if name in _entered:
        _entered[name].set()
        assert _release[name].wait(60), "the test never released the step"
    return {"done": name}


@step_function("tests.run_endings.plain")
def plain(data: dict[str, Any], ctx: Any) -> Any:
    _calls[data.get("tag", "plain")] += 1
    if data.get("fail"):
        raise RuntimeError("plain fails")
    return data.get("n", 1)


@workflow("tests.run_endings.two-steps")
def two_steps(run: Any, input: dict[str, Any]) -> Any:
    first = run.step("first", "tests.run_endings.gated", {"gate": input["gate"]})
    second = run.step("second", "tests.run_endings.plain", {"tag": input["tag"]}, retries=0)
    return {"first": first, "second": second}


@workflow("tests.run_endings.kid")
def kid(run: Any, input: dict[str, Any]) -> Any:
    return run.step("work", "tests.run_endings.plain", input, retries=0)


@workflow("tests.run_endings.gated-kid")
def gated_kid(run: Any, input: dict[str, Any]) -> Any:
    return run.step("work", "tests.run_endings.gated", input, retries=0)


@workflow("tests.run_endings.waiting-kid")
def waiting_kid(run: Any, input: Any) -> Any:
    return run.wait_for_event("go")


@workflow("tests.run_endings.parent")
def parent(run: Any, input: dict[str, Any]) -> Any:
    try:
        got = run.child("kid", input["workflow"], input.get("child", {}))
    except WorkflowChildFailedError as exc:
        if not input.get("catch"):
            raise
        got = {"child_failed": exc.status}
    if input.get("then_wait"):
        run.wait_for_event("more")
    return {"child": got}


@workflow("tests.run_endings.waits")
def waits(run: Any, input: Any) -> Any:
    return run.wait_for_event("go")


# -- signals --------------------------------------------------------------------------------


@pytest.fixture
def ends() -> Iterator[list[tuple[str, uuid.UUID]]]:
    """Every run_completed / run_failed / run_cancelled / run_suspended sent, in order."""
    seen: list[tuple[str, uuid.UUID]] = []
    lock = threading.Lock()
    receivers = []
    for name in ("run_completed", "run_failed", "run_cancelled", "run_suspended"):

        def receiver(sender: Any, run_id: Any, _name: str = name, **kwargs: Any) -> None:
            with lock:
                seen.append((_name, uuid.UUID(str(run_id))))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield seen
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


def ends_of(seen: list[tuple[str, uuid.UUID]], run_id: Any) -> list[str]:
    return [name for name, pk in seen if pk == uuid.UUID(str(run_id))]


def kid_of(run_id: Any) -> WorkflowRun:
    return WorkflowRun.objects.get(parent_id=run_id)


def past_deadline(run_id: Any) -> None:
    """The run's deadline passed an hour ago, on the database clock."""
    WorkflowRun.objects.filter(pk=run_id).update(deadline_at=db_now_plus(-3600))


# -- 1. cancelling a parent: each run ends once, with one signal --------------------------------


def test_a_cascaded_cancel_sends_one_run_cancelled_per_run_and_nothing_else(ends: Any) -> None:
    run_id = start_workflow(
        "tests.run_endings.parent", {"workflow": "tests.run_endings.waiting-kid"}
    )
    drain()
    child = kid_of(run_id)
    assert child.status == RunStatus.RUNNING
    WorkflowRun.objects.cancel(run_id)
    drain()
    assert ends_of(ends, run_id) == ["run_cancelled"]
    assert ends_of(ends, child.pk) == ["run_cancelled"]
    assert run_of(run_id).status == run_of(child.pk).status == RunStatus.CANCELLED


# -- 2. a parent's deadline passing while its child waits ------------------------------------------


def test_a_parents_deadline_fails_it_once_and_cancels_its_child_once(ends: Any) -> None:
    run_id = start_workflow(
        "tests.run_endings.parent",
        {"workflow": "tests.run_endings.waiting-kid"},
        deadline=3600,
    )
    drain()
    child = kid_of(run_id)
    assert child.deadline_at == run_of(run_id).deadline_at, "a child never outlives its parent"
    past_deadline(run_id)
    assert WorkflowRun.objects.expire_deadlines() == [run_id]
    drain()
    assert run_of(run_id).status == RunStatus.FAILED
    assert run_of(run_id).error["type"] == "WorkflowDeadlineExceeded"
    assert run_of(child.pk).status == RunStatus.CANCELLED
    assert ends_of(ends, run_id) == ["run_failed"]
    assert ends_of(ends, child.pk) == ["run_cancelled"]


def _parent_past_deadline_with_waiting_child() -> tuple[uuid.UUID, WorkflowRun]:
    """A parent run whose child waits for an event, driven until it waits, and its deadline
    moved into the past on the database clock; returns the parent's id and the child."""
    run_id = start_workflow(
        "tests.run_endings.parent",
        {"workflow": "tests.run_endings.waiting-kid"},
        deadline=3600,
    )
    drain()
    child = kid_of(run_id)
    past_deadline(run_id)
    return run_id, child


def test_a_cancel_and_a_deadline_racing_end_the_parent_once(ends: Any) -> None:
    run_id, child = _parent_past_deadline_with_waiting_child()
    results = race(
        [lambda: WorkflowRun.objects.cancel(run_id), lambda: WorkflowRun.objects.expire_deadlines()]
    )
    for result in results:
        assert not isinstance(result, BaseException) or isinstance(result, WorkflowRunStateError), (
            repr(result)
        )
    drain()
    assert len(ends_of(ends, run_id)) == 1, ends_of(ends, run_id)
    assert ends_of(ends, child.pk) == ["run_cancelled"]
    assert run_of(child.pk).status == RunStatus.CANCELLED


# -- 3. a cancel, or the parent's deadline, while a real worker runs the child's step ---------


@pytest.mark.parametrize("ending", ["cancel", "deadline"])
def test_ending_a_parent_while_a_worker_runs_its_childs_step_lands_nothing(
    ends: Any, ending: str
) -> None:
    """The parent cancelled, or failed at its deadline, while a worker thread is inside its
    child's step: the step is failed ``RUN_CANCELLED`` (its late result refused), the child
    cancelled, and each run sends one end signal."""
    entered, release = gate(f"kid-{ending}")
    run_id = start_workflow(
        "tests.run_endings.parent",
        {"workflow": "tests.run_endings.gated-kid", "child": {"gate": f"kid-{ending}"}},
        deadline=3600 if ending == "deadline" else None,
    )
    worker = Worker(step_lease_ttl=LEASE)
    thread = start_thread(lambda: drain(worker))
    assert entered.wait(60), "the child's step never started"
    child = kid_of(run_id)
    if ending == "cancel":
        assert WorkflowRun.objects.cancel(run_id).after == RunStatus.CANCELLED
    else:
        past_deadline(run_id)
        assert WorkflowRun.objects.expire_deadlines() == [run_id]
    release.set()
    thread.join(60)
    assert not thread.is_alive()
    drain()
    step = WorkflowStep.objects.get(run_id=child.pk, step_name="work")
    assert step.status == "failed" and step.error["code"] == RUN_CANCELLED
    assert run_of(child.pk).status == RunStatus.CANCELLED
    status, signal = (
        (RunStatus.CANCELLED, "run_cancelled")
        if ending == "cancel"
        else (RunStatus.FAILED, "run_failed")
    )
    assert run_of(run_id).status == status
    assert ends_of(ends, child.pk) == ["run_cancelled"]
    assert ends_of(ends, run_id) == [signal]


# -- 4. a deadline passing while the only worker runs a step ---------------------------------------


def test_a_deadline_passed_while_the_worker_ran_a_step_is_not_outrun_by_the_next_steps(
    ends: Any,
) -> None:
    """A run not finished by its deadline is failed within about one poll interval of it,
    also when the only worker thread drives it step after step: here that thread is busy in
    step ``first`` when the deadline passes (an hour before the step returns, on the
    database clock) and the worker's look for deadlines is overdue. The pass leaves step
    ``second`` to its queue instead of running it, the thread looks, and the run fails:
    ``second`` never runs and the run sends ``run_failed`` only."""
    entered, release = gate("slow-first")
    run_id = start_workflow(
        "tests.run_endings.two-steps",
        {"gate": "slow-first", "tag": "after-deadline"},
        deadline=3600,
    )
    worker = Worker(step_lease_ttl=LEASE)
    thread = start_thread(lambda: worker.work_once())
    assert entered.wait(60), "step first never started"
    past_deadline(run_id)  # the deadline passed long ago (far more than one poll interval)
    # ... and so did this worker's last look for deadlines: one is due (the step ran for
    # longer than WORKER_POLL_INTERVAL, as the hour on the database clock says).
    worker._deadlines_at = 0.0
    release.set()
    thread.join(60)
    assert not thread.is_alive()
    drain(worker)
    run = run_of(run_id)
    assert (run.status, _calls["after-deadline"]) == (RunStatus.FAILED, 0), (
        f"an hour past its deadline the run is {run.status} ({run.output}); step 'second' ran "
        f"{_calls['after-deadline']} time(s)"
    )
    assert ends_of(ends, run_id) == ["run_failed"]


# -- 5. an orphan: a failed child resumed (or retried) under its cancelled parent -----------------


def _cancelled_parent_with_failed_child() -> tuple[uuid.UUID, uuid.UUID]:
    run_id = start_workflow(
        "tests.run_endings.parent",
        {
            "workflow": "tests.run_endings.kid",
            "child": {"fail": True},
            "catch": True,
            "then_wait": True,
        },
    )
    drain()
    child = kid_of(run_id)
    assert run_of(child.pk).status == RunStatus.FAILED
    assert run_of(run_id).status == RunStatus.RUNNING  # caught, waits for "more"
    WorkflowRun.objects.cancel(run_id)
    assert run_of(child.pk).status == RunStatus.FAILED, "a finished child is left alone"
    return run_id, child.pk


@pytest.mark.parametrize("operation", ["resume", "retry", "retry_step"])
def test_an_operator_cannot_bring_a_child_back_to_life_under_a_cancelled_parent(
    operation: str,
) -> None:
    """A cancelled parent has no live child (its cancel took them along): an operator's
    resume / retry of a failed child of it is refused (nothing written), since it would
    leave a running orphan nobody waits for and no cancel reaches."""
    run_id, child_id = _cancelled_parent_with_failed_child()
    runs = WorkflowRun.objects
    with pytest.raises(WorkflowRunStateError, match=f"its parent run {run_id} is cancelled"):
        if operation == "retry_step":
            runs.retry_step(child_id, "work")
        else:
            getattr(runs, operation)(child_id)
    live = WorkflowRun.objects.filter(
        parent_id=run_id, status__in=(RunStatus.RUNNING, RunStatus.SUSPENDED)
    )
    assert not live.exists(), f"{operation}: a live child under cancelled parent {run_id}"


# -- 6. send-event racing a cancel ----------------------------------------------------------


def test_an_event_racing_a_cancel_never_completes_the_run(ends: Any) -> None:
    for _ in range(5):
        run_id = start_workflow("tests.run_endings.waits", {})
        drain()
        results = race(
            [
                lambda run_id=run_id: WorkflowWait.objects.send_event(run_id, "go", {"x": 1}),
                lambda run_id=run_id: WorkflowRun.objects.cancel(run_id),
            ]
        )
        assert not isinstance(results[1], BaseException), repr(results[1])
        drain()
        assert run_of(run_id).status == RunStatus.CANCELLED
        assert ends_of(ends, run_id) == ["run_cancelled"]


# -- 7. a suspended run passing its deadline -------------------------------------------------


def test_a_suspended_run_past_its_deadline_fails_once(ends: Any) -> None:
    run_id = start_workflow("tests.run_endings.kid", {}, deadline=3600)
    WorkflowRun.objects.suspend(run_id, "the step function is missing")
    past_deadline(run_id)
    assert WorkflowRun.objects.expire_deadlines() == [run_id]
    assert WorkflowRun.objects.expire_deadlines() == []
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED and run.error["type"] == "WorkflowDeadlineExceeded"
    assert ends_of(ends, run_id) == ["run_suspended", "run_failed"]


# -- 8. a run failed at its deadline, retried: no work before it fails again -----------------------


def test_retrying_a_step_of_a_run_failed_at_its_deadline_runs_no_step(ends: Any) -> None:
    entered, release = gate("deadline-retry")
    run_id = start_workflow(
        "tests.run_endings.two-steps", {"gate": "deadline-retry", "tag": "x"}, deadline=3600
    )
    worker = Worker(step_lease_ttl=LEASE)
    thread = start_thread(lambda: worker.work_once())
    assert entered.wait(60)
    past_deadline(run_id)
    assert WorkflowRun.objects.expire_deadlines() == [run_id]
    release.set()
    thread.join(60)
    assert run_of(run_id).status == RunStatus.FAILED
    _entered.pop("deadline-retry")
    before = _calls["deadline-retry"]
    WorkflowRun.objects.retry_step(run_id, "first")
    drain(Worker(step_lease_ttl=LEASE))
    # timing.md: "the resumed run is failed again at the workers' next look, since its
    # deadline has passed" — not after running its steps again.
    assert _calls["deadline-retry"] == before, "the step ran again past the run's deadline"
    assert run_of(run_id).status == RunStatus.FAILED


# -- 9. a fork shares no rows with its origin ------------------------------------------


def test_a_fork_of_a_run_mid_step_shares_no_rows_and_survives_its_origins_cancel(
    ends: Any,
) -> None:
    entered, release = gate("fork-origin")
    run_id = start_workflow("tests.run_endings.two-steps", {"gate": "fork-origin", "tag": "forked"})
    worker = Worker(step_lease_ttl=LEASE)
    thread = start_thread(lambda: drain(worker))
    assert entered.wait(60)
    # Step "first" runs in the origin; fork from it and cancel the origin.
    new_id = fork_run(run_id, from_step="first")
    WorkflowRun.objects.cancel(run_id)
    release.set()
    thread.join(60)
    origin_steps = set(WorkflowStep.objects.filter(run_id=run_id).values_list("pk", flat=True))
    fork_steps = set(WorkflowStep.objects.filter(run_id=new_id).values_list("pk", flat=True))
    assert not origin_steps & fork_steps
    _entered.pop("fork-origin")
    drain()
    assert run_of(run_id).status == RunStatus.CANCELLED
    fork = run_of(new_id)
    assert fork.status == RunStatus.COMPLETED, (fork.status, fork.error)
    assert ends_of(ends, run_id) == ["run_cancelled"]
    assert ends_of(ends, new_id) == ["run_completed"]


# -- 10. a child's deadline is capped by its parent's ------------------------------------------


def test_a_childs_own_later_deadline_is_capped_by_its_parents() -> None:
    run_id = start_workflow(
        "tests.run_endings.parent",
        {"workflow": "tests.run_endings.waiting-kid"},
        deadline=timedelta(minutes=1),
    )
    drain()
    assert kid_of(run_id).deadline_at == run_of(run_id).deadline_at


# -- 11. a child's cancel racing its parent's deadline ----------------------------------------


def test_a_childs_cancel_racing_its_parents_deadline_ends_each_once(ends: Any) -> None:
    for _ in range(3):
        run_id, child = _parent_past_deadline_with_waiting_child()
        results = race(
            [
                lambda child=child: WorkflowRun.objects.cancel(child.pk),
                lambda: WorkflowRun.objects.expire_deadlines(),
            ]
        )
        for result in results:
            assert not isinstance(result, BaseException) or isinstance(
                result, WorkflowRunStateError
            ), repr(result)
        WorkflowRun.objects.expire_deadlines()
        drain()
        assert run_of(run_id).status == RunStatus.FAILED
        assert ends_of(ends, run_id) == ["run_failed"]
        assert ends_of(ends, child.pk) == ["run_cancelled"]
