"""Workflow code that is not deterministic under replay, or changed between two passes: what
the engine does with it (fail the run with a clear error, never run a step twice or wait for
ever) and what the ``check-replay`` deploy gate reports (docs/howto/deploys.md,
docs/howto/workflows.md, docs/howto/waits.md)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from django_leases.models import RunStatus, WorkflowStep, WorkflowWait
from django_leases.testing import drive
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from django_leases.workflows.replay_check import check_replay
from django_leases.workflows.values import StepStatus
from tests.helpers import drain, run_of
from tests.test_replay_check import check

ECHO = "tests.replay-divergence.echo"
OTHER = "tests.replay-divergence.other"

#: The code "deployed" now; a test switches it to ship a change.
deployed: dict[str, Any] = {}
#: Step names whose step function ran, in order (one entry per call).
ran: list[str] = []
#: How many times each workflow function was called (passes and dry replays).
calls: dict[str, int] = {}


def _noted(data: Any, ctx: Any) -> Any:
    """Both step functions: note the step's name, return its data."""
    ran.append(ctx.step_name)
    return data


step_function(ECHO)(_noted)
step_function(OTHER)(_noted)


@pytest.fixture(autouse=True)
def v1_deployed() -> Iterator[None]:
    deployed.clear()
    ran.clear()
    calls.clear()
    yield
    deployed.clear()


def _count(name: str) -> None:
    calls[name] = calls.get(name, 0) + 1


# -- the deploy gate and workflow code that raises a BaseException --------------------------


@workflow("tests.replay-divergence.exits")
def exits(run: Any, input: Any) -> Any:
    run.step("a", ECHO, "a")
    if deployed.get("code") == "exits":
        # New code that calls sys.exit() (a CLI helper reused in a workflow, say) where the
        # old code ran step "b": the run recorded "b" and the code never reaches it.
        sys.exit(deployed.get("status", 0))
    run.step("b", ECHO, "b")
    run.wait_for_event("go")
    return run.step("c", ECHO, "c")


@pytest.mark.django_db
def test_check_replay_reports_a_workflow_that_raises_systemexit_instead_of_dying() -> None:
    """The gate replays every live run; a run whose new code raises where it recorded a
    step would not replay (deploys.md's table: "the workflow raises" while recorded steps
    remain unmet). The engine treats a ``SystemExit`` from workflow code as the workflow
    raising (the run fails WORKFLOW_ERROR); the gate must report the run, not let the
    exception escape."""
    run_id = start_workflow("tests.replay-divergence.exits", {})
    assert drive(run_id).status == RunStatus.RUNNING  # type: ignore[union-attr]
    deployed["code"] = "exits"
    report = check_replay()  # must not raise SystemExit
    assert not report.ok
    (found,) = report.divergences
    assert found.run_id == run_id and found.recorded.name == "b", found


@pytest.mark.django_db
def test_check_replay_command_does_not_exit_0_when_the_new_code_calls_sys_exit() -> None:
    """``sys.exit(0)`` in the code replayed must not end the deploy gate's process with
    status 0 ("every run replays") while a live run would not replay: exit 3, as for any
    run that would meet an action other than the one it recorded."""
    run_id = start_workflow("tests.replay-divergence.exits", {})
    assert drive(run_id).status == RunStatus.RUNNING  # type: ignore[union-attr]
    deployed["code"] = "exits"
    try:
        status, out, _ = check()
    except SystemExit as exc:  # the command let the workflow's exit end the process
        pytest.fail(f"check-replay ended with the workflow's SystemExit({exc.code!r})")
    assert status == 3, out


@pytest.mark.django_db
def test_engine_fails_a_run_whose_workflow_raises_systemexit() -> None:
    """The engine side of the same code: the run fails with WORKFLOW_ERROR, and
    step "b" never runs."""
    run_id = start_workflow("tests.replay-divergence.exits", {})
    drive(run_id)
    deployed.update(code="exits", status=0)
    send_event(run_id, "go", 1)  # wakes the run: the pass replays on the new code
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.FAILED, run.status
    assert run.error["code"] == "WORKFLOW_ERROR", run.error
    assert ran == ["a", "b"]


# -- a name recorded as a step, met as a wait after a deploy (and back) ----------------------


@workflow("tests.replay-divergence.step-to-wait")
def step_to_wait(run: Any, input: Any) -> Any:
    if deployed.get("code") == "as-wait":
        # The step "check" became an event wait of the same name.
        verdict = run.wait_for_event("check")
    else:
        verdict = run.step("check", ECHO, {"ok": True})
    run.wait_for_event("go")
    return run.step("finish", ECHO, verdict)


@pytest.mark.django_db
def test_a_recorded_step_met_as_a_wait_of_the_same_name_fails_the_run() -> None:
    """waits.md: "Names are shared with steps: a name used twice in one run (by a step and a
    wait, or by two waits) fails the run with a clear error". A run recorded step "check";
    the code deployed now waits for an event "check". The run must fail with a clear error
    — not record a wait "check" beside the step "check" and wait for an event nobody will
    send, for ever."""
    run_id = start_workflow("tests.replay-divergence.step-to-wait", {})
    assert drive(run_id).status == RunStatus.RUNNING  # type: ignore[union-attr]
    deployed["code"] = "as-wait"
    send_event(run_id, "go", 1)
    run = drive(run_id)
    assert run is not None
    names = list(WorkflowWait.objects.filter(run_id=run_id).values_list("name", flat=True))
    assert run.status == RunStatus.FAILED, (run.status, names)
    assert "check" in run.error["message"], run.error


@pytest.mark.django_db
def test_check_replay_reports_a_step_turned_into_a_wait_of_the_same_name() -> None:
    """The same change is reported by check-replay."""
    run_id = start_workflow("tests.replay-divergence.step-to-wait", {})
    drive(run_id)
    deployed["code"] = "as-wait"
    report = check_replay()
    assert not report.ok
    (found,) = report.divergences
    assert found.run_id == run_id and found.recorded.kind == "step", found


# -- a wait's kind changed --------------------------------------------------------------------


@workflow("tests.replay-divergence.kinds")
def kinds(run: Any, input: Any) -> Any:
    run.step("a", ECHO, "a")
    if deployed.get("code") == "event":
        run.wait_for_event("w")
    else:
        run.sleep("w", 0)
    run.wait_for_event("go")
    return run.step("b", ECHO, "b")


@pytest.mark.django_db
def test_a_sleep_met_as_an_event_wait_fails_the_run_clearly() -> None:
    """waits.md: a name the run reached as one kind of wait that the workflow now
    uses as another fails the run with a clear error."""
    run_id = start_workflow("tests.replay-divergence.kinds", {})
    assert drive(run_id).status == RunStatus.RUNNING  # type: ignore[union-attr]
    deployed["code"] = "event"
    assert not check_replay().ok
    send_event(run_id, "go", 1)
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.FAILED, run.status
    assert "'w'" in run.error["message"], run.error
    assert ran == ["a"]


# -- names generated in a loop that collide ---------------------------------------------------


@workflow("tests.replay-divergence.loop")
def loop(run: Any, input: Any) -> Any:
    total = 0
    for item in input["items"]:
        total += run.step(f"charge-{item['customer']}", ECHO, item["amount"])
    return total


@pytest.mark.django_db(transaction=True)
def test_colliding_loop_names_fail_the_run_once_on_a_real_worker() -> None:
    """workflows.md: a step name used twice is a ``ValueError`` that fails
    the run. Two items of one customer: the second ``charge-7`` must fail the run (WORKFLOW_
    ERROR naming it) — the first charge ran once, no second charge, no retry loop."""
    from django_leases.workflows.worker import Worker

    run_id = start_workflow(
        "tests.replay-divergence.loop",
        {"items": [{"customer": 7, "amount": 5}, {"customer": 7, "amount": 9}]},
    )
    drain(Worker(step_lease_ttl=60.0))
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, run.status
    assert run.error["code"] == "WORKFLOW_ERROR" and "charge-7" in run.error["message"]
    assert ran == ["charge-7"]
    step = WorkflowStep.objects.get(run_id=run_id, step_name="charge-7")
    assert step.status == StepStatus.SUCCEEDED and step.result == 5


# -- a workflow that raises only on replay ----------------------------------------------------


@workflow("tests.replay-divergence.raises-on-replay")
def raises_on_replay(run: Any, input: Any) -> Any:
    _count("raises-on-replay")
    run.step("a", ECHO, "a")
    if calls["raises-on-replay"] > 1:
        raise RuntimeError("only on replay")
    run.wait_for_event("go")
    return run.step("b", ECHO, "b")


@pytest.mark.django_db(transaction=True)
def test_a_workflow_raising_only_on_replay_fails_the_run_and_settles() -> None:
    """A workflow that raises only when replayed fails its run
    (WORKFLOW_ERROR) — the worker does not crash, loop or run "a" again."""
    from django_leases.workflows.worker import Worker

    run_id = start_workflow("tests.replay-divergence.raises-on-replay", {})
    drain(Worker(step_lease_ttl=60.0))
    assert run_of(run_id).status == RunStatus.RUNNING  # at its event
    send_event(run_id, "go", 1)
    drain(Worker(step_lease_ttl=60.0))
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, run.status
    assert run.error["code"] == "WORKFLOW_ERROR" and "only on replay" in run.error["message"]
    assert ran == ["a"]


# -- the fan-out's width changed -------------------------------------------------------------


@workflow("tests.replay-divergence.fan")
def fan(run: Any, input: Any) -> Any:
    width = deployed.get("width", 3)
    results = run.parallel([(f"part-{i}", ECHO, i) for i in range(width)])
    run.wait_for_event("go")
    return run.step("sum", ECHO, sum(results))


@pytest.mark.django_db
@pytest.mark.parametrize("width", [2, 4])
def test_check_replay_reports_a_fan_out_of_another_width(width: int) -> None:
    """deploys.md: a step inserted (a wider fan-out: part-3) or removed (a narrower one:
    part-2 recorded, unmet) is reported, for a run parked at the event after it."""
    run_id = start_workflow("tests.replay-divergence.fan", {})
    assert drive(run_id).status == RunStatus.RUNNING  # type: ignore[union-attr]
    deployed["width"] = width
    report = check_replay()
    assert not report.ok, report.summary()
    (found,) = report.divergences
    assert found.run_id == run_id, found


@pytest.mark.django_db
def test_a_narrower_fan_out_lands_the_result_without_the_dropped_branch() -> None:
    """(Documented, shown.) The engine meets steps by name: a narrower fan-out replays the
    recorded branches it still names and the run completes with their sum (part-2 is left
    unread — what deploys.md says of a removed step)."""
    run_id = start_workflow("tests.replay-divergence.fan", {})
    drive(run_id)
    deployed["width"] = 2
    send_event(run_id, "go", 1)
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.COMPLETED
    assert run.output == 1
    assert ran.count("part-0") == 1


# -- step names from the clock: the gate reports them -----------------------------------------


@workflow("tests.replay-divergence.stamped")
def stamped(run: Any, input: Any) -> Any:
    import time

    run.step(f"stamp-{time.time_ns()}", ECHO, "x")  # not deterministic
    run.wait_for_event("go")
    return 1


@pytest.mark.django_db(transaction=True)
def test_check_replay_reports_a_step_named_after_the_clock() -> None:
    """A step named from the clock is a new step to every replay; the
    gate reports it (recorded: the stamp; new: another stamp). The run is parked by a real
    worker (which keeps the workflow's frame: the step is met once)."""
    from django_leases.workflows.worker import Worker

    run_id = start_workflow("tests.replay-divergence.stamped", {})
    drain(Worker(step_lease_ttl=60.0))
    assert run_of(run_id).status == RunStatus.RUNNING and len(ran) == 1
    report = check_replay()
    assert not report.ok
    (found,) = report.divergences
    assert found.recorded.name.startswith("stamp-") and found.new.name.startswith("stamp-")
    assert found.recorded.name != found.new.name


@pytest.mark.django_db
def test_drive_calls_a_workflow_that_meets_new_steps_on_every_replay_not_deterministic() -> None:
    """Under ``drive()`` every step is run by itself and the next pass replays: a step named
    from the clock is a new step to each replay, so the run never settles. ``drive()`` says
    so after a few passes (``MisuseError`` naming the steps left unmet) instead of running
    the step function until ``max_units`` (100,000 by default: minutes)."""
    from django_leases.exceptions import MisuseError
    from django_leases.testing.driving import UNREPLAYED_PASSES

    run_id = start_workflow("tests.replay-divergence.stamped", {})
    with pytest.raises(MisuseError, match=r"does not replay.*'stamp-"):
        drive(run_id)
    assert len(ran) == UNREPLAYED_PASSES, ran


# -- a step function changed under a parked fan-out ------------------------------------------


@workflow("tests.replay-divergence.fan-function")
def fan_function(run: Any, input: Any) -> Any:
    function = OTHER if deployed.get("code") == "other" else ECHO
    run.parallel([("p0", ECHO, 0), ("p1", function, 1)])
    return "done"


@pytest.mark.django_db(transaction=True)
def test_a_step_function_changed_under_a_parked_fan_out_fails_the_run() -> None:
    """workflows.md: a step recorded with another step function than the workflow now asks
    for is a ``ValueError`` that fails the run. The fan-out's steps are scheduled under
    ECHO; the code deployed before they run asks for OTHER for p1. The run fails naming p1,
    and completes with no result."""
    from django_leases.workflows.worker import Worker

    worker = Worker(step_lease_ttl=60.0)
    run_id = start_workflow("tests.replay-divergence.fan-function", {})
    assert worker.work_once()  # the pass that schedules p0, p1 and ends
    assert set(WorkflowStep.objects.filter(run_id=run_id).values_list("step_name", flat=True)) == {
        "p0",
        "p1",
    }
    deployed["code"] = "other"
    drain(worker)
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, (run.status, run.output)
    assert "p1" in run.error["message"], run.error
