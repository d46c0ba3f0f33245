"""``manage.py workflow_runs check-replay``: every live run replayed in memory against the
code now deployed, writing nothing; exit 0 when all replay, 3 when one would meet an action
other than the one it recorded (run, recorded action and new action named, in text and
JSON)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.management.base import EXIT_REPLAY_DIVERGES
from django_leases.models import (
    Lease,
    RunStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
    WorkflowWait,
)
from django_leases.models.wait import WorkflowWaitQuerySet
from django_leases.testing import drive
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from django_leases.workflows.replay_check import check_replay
from django_leases.workflows.values import StepStatus, run_lease_key
from tests.helpers import manage
from tests.test_workflow_conformance import statements_sent

pytestmark = pytest.mark.django_db

ECHO = "tests.replay.echo"
OTHER = "tests.replay.other"

#: The code the test workflows run now ("deployed" by a test).
deployed = {"code": "v1"}


@step_function(ECHO)
def echo(data: Any, ctx: Any) -> Any:
    return data


@step_function(OTHER)
def other(data: Any, ctx: Any) -> Any:
    return data


def _steps(run: Any, names: list[str], *, function: str = ECHO, changed: str = "") -> list[Any]:
    return [run.step(name, function if name == changed else ECHO, name) for name in names]


def _flow(run: Any, before: list[str], after: list[str], **options: Any) -> Any:
    done = _steps(run, before, **options)
    done.append(run.wait_for_event("go"))
    return done + _steps(run, after)


#: Each version of the code of workflow ``tests.replay.flow``; "v1" is the one runs start on.
CODES: dict[str, Callable[[Any], Any]] = {
    "v1": lambda run: _flow(run, ["a", "b", "c"], ["d"]),
    "renamed": lambda run: _flow(run, ["a", "b2", "c"], ["d"]),
    "removed": lambda run: _flow(run, ["a", "c"], ["d"]),
    "removed-last": lambda run: _flow(run, ["a", "b"], ["d"]),
    "reordered": lambda run: _flow(run, ["a", "c", "b"], ["d"]),
    "inserted": lambda run: _flow(run, ["a", "x", "b", "c"], ["d"]),
    "inserted-with-patch": lambda run: _flow(
        run, ["a", *(["x"] if run.patched("add-x") else []), "b", "c"], ["d"]
    ),
    "function": lambda run: _flow(run, ["a", "b", "c"], ["d"], function=OTHER, changed="b"),
    "appended": lambda run: _flow(run, ["a", "b", "c"], ["d", "e"]),
}


@workflow("tests.replay.flow")
def flow(run: Any, input: Any) -> Any:
    return CODES[deployed["code"]](run)


@workflow("tests.replay.nap")
def nap(run: Any, input: Any) -> Any:
    run.step("a", ECHO, "a")
    run.sleep("nap", 3600)
    if deployed["code"] == "v1":
        return run.step("b", ECHO, "b")
    return run.step("b-new", ECHO, "b-new")


@workflow("tests.replay.two-waits")
def two_waits(run: Any, input: Any) -> Any:
    run.step("a", ECHO, "a")
    run.wait_for_event("go")
    run.step("b", ECHO, "b")
    run.wait_for_event("go2")
    return run.step("c", ECHO, "c")


@pytest.fixture(autouse=True)
def v1_deployed() -> Iterator[None]:
    deployed["code"] = "v1"
    yield
    deployed["code"] = "v1"


def check(*args: str) -> tuple[int, str, str]:
    """Run ``workflow_runs check-replay ARGS``: (exit status, stdout, stderr)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("workflow_runs", "check-replay", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue()


def at_go() -> uuid.UUID:
    """A run of ``tests.replay.flow`` on the v1 code, waiting for event "go" (a, b, c
    recorded)."""
    run_id = start_workflow("tests.replay.flow", {})
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.RUNNING
    return run_id


def test_no_live_run_and_unchanged_code_replay() -> None:
    assert check() == (0, "All 0 live run(s) replay on the code now deployed.\n", "")
    done = at_go()
    send_event(done, "go", 1)
    assert drive(done).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    at_go()
    sleeping = start_workflow("tests.replay.nap", {})
    drive(sleeping, skip_sleeps=False)
    WorkflowRun.objects.start("tests.replay.flow", {})  # no pass ran yet
    status, out, _ = check()
    assert (status, out) == (0, "All 3 live run(s) replay on the code now deployed.\n")
    deployed["code"] = "appended"  # a step added after where every run stands
    assert check()[0] == 0


@pytest.mark.parametrize(
    ("code", "recorded", "new"),
    [
        ("renamed", "step 'b' (step function 'tests.replay.echo')", "step 'b2'"),
        ("removed", "step 'b' (step function 'tests.replay.echo')", "step 'c'"),
        ("removed-last", "step 'c' (step function 'tests.replay.echo')", "wait_for_event 'go'"),
        ("reordered", "step 'b' (step function 'tests.replay.echo')", "step 'c'"),
        ("inserted", "step 'b' (step function 'tests.replay.echo')", "step 'x'"),
        (
            "function",
            "step 'b' (step function 'tests.replay.echo')",
            "step 'b' (step function 'tests.replay.other')",
        ),
    ],
)
def test_a_changed_workflow_is_reported_with_the_recorded_and_the_new_action(
    code: str, recorded: str, new: str
) -> None:
    run_id = at_go()
    fresh = start_workflow("tests.replay.flow", {})  # nothing recorded: replays on any code
    deployed["code"] = code
    status, out, err = check()
    assert status == EXIT_REPLAY_DIVERGES == 3
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert lines[0].startswith(f"Run {run_id} (tests.replay.flow, running): recorded {recorded};")
    assert f"the code now meets {new}" in lines[0]
    assert str(fresh) not in out
    assert lines[1] == err == "1 of 2 live run(s) would not replay on the code now deployed."
    status, out, _ = check("--format", "json")
    report = json.loads(out)
    assert status == 3
    assert (report["ok"], report["checked"], report["diverged"]) == (False, 2, 1)
    (found,) = report["runs"]
    assert (found["run_id"], found["workflow"], found["status"]) == (
        str(run_id),
        "tests.replay.flow",
        "running",
    )
    assert found["recorded"]["text"] == recorded
    assert found["new"]["text"].startswith(new)


def test_a_step_inserted_with_a_patch_replays_for_old_runs_and_new_ones() -> None:
    old = at_go()
    deployed["code"] = "inserted-with-patch"
    new = at_go()  # on the new code: takes the new path, waits for "go"
    assert WorkflowStep.objects.get(run_id=new, step_name="add-x").result is True
    assert check() == (0, "All 2 live run(s) replay on the code now deployed.\n", "")
    send_event(old, "go", 1)
    run = drive(old)
    assert run is not None and run.output == ["a", "b", "c", 1, "d"]
    assert WorkflowStep.objects.get(run_id=old, step_name="add-x").result is False
    send_event(new, "go", 2)
    run = drive(new)
    assert run is not None and run.output == ["a", "x", "b", "c", 2, "d"]
    deployed["code"] = "v1"  # the patch retired too early: the new run recorded x
    assert check()[0] == 0  # both finished: nothing live to check


def test_a_retired_patch_replays_and_a_retired_too_early_does_not() -> None:
    deployed["code"] = "inserted-with-patch"
    new = at_go()
    deployed["code"] = "v1"  # the patch removed while a run that took it is live
    status, out, _ = check()
    assert status == 3 and f"Run {new}" in out and "recorded step 'x'" in out
    deployed["code"] = "inserted"  # the patch retired by keeping its new path
    assert check()[0] == 0


def test_a_sleeping_run_and_a_suspended_one_are_checked() -> None:
    suspended = at_go()
    WorkflowRun.objects.filter(pk=suspended).update(status=RunStatus.SUSPENDED)
    sleeping = start_workflow("tests.replay.nap", {})
    drive(sleeping, skip_sleeps=False)
    assert WorkflowWait.objects.get(run_id=sleeping).status == "waiting"
    deployed["code"] = "renamed"  # changes flow (not nap, whose change is after the sleep)
    status, out, _ = check("--format", "json")
    report = json.loads(out)
    assert (status, report["checked"]) == (3, 2)
    assert [(run["run_id"], run["status"]) for run in report["runs"]] == [
        (str(suspended), "suspended")
    ]


def test_a_run_of_a_workflow_no_code_registers_is_reported() -> None:
    run = WorkflowRun.objects.start("tests.replay.gone", {})
    status, out, _ = check()
    assert status == 3
    assert (
        f"Run {run.id} (tests.replay.gone, running): recorded workflow 'tests.replay.gone'; "
        "the code now meets no code registers workflow 'tests.replay.gone'"
    ) in out


def _rows() -> list[list[dict[str, Any]]]:
    return [
        list(model.objects.order_by("pk").values())
        for model in (WorkflowRun, WorkflowStep, WorkflowStepAttempt, WorkflowWait, Lease)
    ]


def test_the_check_writes_nothing_also_while_a_worker_holds_a_run_lease() -> None:
    runs = [at_go() for _ in range(3)]
    held = Lease.objects.acquire(run_lease_key(runs[0]), "worker-1", 60)
    assert held is not None
    deployed["code"] = "renamed"
    before = _rows()
    with statements_sent() as sent:
        status, _, _ = check()
        assert status == 3
        report = check_replay(batch_size=2)
    assert len(report.divergences) == 3
    assert _rows() == before
    assert sent and all(statement.lstrip().upper().startswith("SELECT") for statement in sent), [
        statement for statement in sent if not statement.lstrip().upper().startswith("SELECT")
    ]
    assert Lease.objects.current(run_lease_key(runs[0])).token == held.token  # type: ignore[union-attr]


def test_reads_are_batched_not_one_per_run() -> None:
    for _ in range(12):
        at_go()
    deployed["code"] = "renamed"
    with CaptureQueriesContext(connection) as queries:
        report = check_replay(batch_size=5)
    assert report.checked == 12 and len(report.divergences) == 12
    # 3 batches (5, 5, 2): runs, steps, waits; each read and replayed again, as it diverged.
    assert len(queries) == 3 * 3 * 2
    deployed["code"] = "v1"
    with CaptureQueriesContext(connection) as queries:
        report = check_replay(batch_size=5)
    assert report.checked == 12 and report.ok
    assert len(queries) == 3 * 3  # nothing diverged: nothing read again


def test_patch_markers_are_not_steps_to_the_replay() -> None:
    deployed["code"] = "inserted-with-patch"
    run_id = at_go()
    markers = WorkflowStep.objects.filter(run_id=run_id, status=StepStatus.PATCH)
    assert list(markers.values_list("step_name", "function_name")) == [("add-x", "")]
    deployed["code"] = "inserted"
    assert check()[0] == 0


def test_the_command_exits_0_then_3_as_a_process(subprocess_env: dict[str, str]) -> None:
    done = WorkflowRun.objects.start("tests.replay.gone", {})
    WorkflowRun.objects.complete(done.id, None)
    ok = manage("workflow_runs", "check-replay", env=subprocess_env)
    assert (ok.returncode, ok.stdout) == (
        0,
        "All 0 live run(s) replay on the code now deployed.\n",
    ), ok.stderr
    live = WorkflowRun.objects.start("tests.replay.gone", {})
    failed = manage("workflow_runs", "check-replay", "--format", "json", env=subprocess_env)
    assert failed.returncode == 3, failed.stderr
    report = json.loads(failed.stdout)
    assert [run["run_id"] for run in report["runs"]] == [str(live.id)]
    assert report["runs"][0]["new"]["kind"] == "missing"
    assert "1 of 1 live run(s) would not replay" in failed.stderr


def test_a_run_that_moved_on_between_two_reads_is_read_again_not_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = start_workflow("tests.replay.two-waits", {})
    drive(run_id)  # a recorded, waits for "go"
    read_waits = WorkflowWaitQuerySet.for_replay
    moved: list[bool] = []

    def a_worker_between_the_reads(self: Any, run_ids: Any) -> Any:
        if not moved:  # after the steps were read: b recorded, "go2" reached
            moved.append(True)
            send_event(run_id, "go", 1)
            drive(run_id)
            assert list(WorkflowStep.objects.filter(run_id=run_id).values_list("step_name")) == [
                ("a",),
                ("b",),
            ]
        return read_waits(self, run_ids)

    monkeypatch.setattr(WorkflowWaitQuerySet, "for_replay", a_worker_between_the_reads)
    report = check_replay()
    assert moved and report.checked == 1
    assert report.ok, [str(found) for found in report.divergences]
