"""``django_leases.testing.drive`` runs users' workflows to the end inside Django's
``TestCase`` (one transaction around each test), on SQLite and PostgreSQL: sleeps jumped,
events sent, fan-outs, children and retries — where a worker refuses to start."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from django.core.management import CommandError, call_command
from django.db import connection
from django.test import TestCase

from django_leases.clock import db_now
from django_leases.exceptions import WorkflowEventTimeout, WorkflowRunStateError
from django_leases.models import (
    Lease,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowWait,
)
from django_leases.testing import drive, time_out
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from django_leases.workflows.display import queue_overview
from django_leases.workflows.values import WaitStatus


@step_function("tests.drive.add")
def add(data: dict[str, Any], ctx: Any) -> int:
    if ctx.attempt <= data.get("fail_times", 0):
        raise RuntimeError("not yet")
    return int(data["a"]) + int(data["b"])


@workflow("tests.drive.child")
def child(run: Any, input: dict[str, Any]) -> Any:
    return run.step("add", "tests.drive.add", {"a": input["n"], "b": 100})


@workflow("tests.drive.everything")
def everything(run: Any, input: dict[str, Any]) -> Any:
    first = run.step("first", "tests.drive.add", {"a": 1, "b": 1, "fail_times": 1}, retry_delay=600)
    run.sleep("a-day", 86400)
    sums = run.parallel([(f"p{n}", "tests.drive.add", {"a": n, "b": n}) for n in range(3)])
    approval = run.wait_for_event("approval")
    from_child = run.child("kid", "tests.drive.child", {"n": approval["n"]})
    return {"first": first, "sums": sums, "child": from_child}


@workflow("tests.drive.timeout")
def with_timeout(run: Any, input: Any) -> Any:
    try:
        run.wait_for_event("approval", timeout=3600)
    except WorkflowEventTimeout:
        return {"timed_out": True}
    return {"timed_out": False}


@contextlib.contextmanager
def _session_zone_ahead_of_utc() -> Iterator[None]:
    """On MariaDB / MySQL, the session's time zone five hours ahead of UTC meanwhile (a
    server configured for its local zone); elsewhere nothing."""
    if connection.vendor != "mysql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.time_zone")
        (before,) = cursor.fetchone()
        cursor.execute("SET time_zone = '+05:00'")
        try:
            yield
        finally:
            cursor.execute("SET time_zone = %s", [before])


class DriveInATestCase(TestCase):
    def test_a_workflow_with_every_kind_of_wait_runs_to_the_end(self) -> None:
        self.assertTrue(connection.in_atomic_block, "TestCase: one transaction")
        threads = set(threading.enumerate())
        run_id = start_workflow("tests.drive.everything", {})
        run = drive(run_id)
        assert run is not None
        self.assertEqual(run.status, RunStatus.RUNNING)
        wait = WorkflowWait.objects.get(run_id=run_id, name="approval")
        self.assertEqual(wait.status, WaitStatus.WAITING, "stopped at the event: nothing due")
        self.assertEqual(WorkflowWait.objects.get(run_id=run_id, name="a-day").status, "done")
        send_event(run_id, "approval", {"n": 5})
        run = drive(run_id)
        assert run is not None
        self.assertEqual(run.status, RunStatus.COMPLETED)
        self.assertEqual(run.output, {"first": 2, "sums": [0, 2, 4], "child": 105})
        self.assertEqual(WorkflowRun.objects.get(parent_id=run_id).status, RunStatus.COMPLETED)
        started = set(threading.enumerate()) - threads
        self.assertEqual(started, set(), "no worker thread was started")
        self.assertTrue(Lease.objects.filter(key=f"workflow-run:{run_id}").exists())

    def test_an_event_timeout_is_tested_as_the_docs_say(self) -> None:
        run_id = start_workflow("tests.drive.timeout", {})
        drive(run_id)
        with _session_zone_ahead_of_utc():
            # As docs/howto/testing.md says, also where the session's zone is not UTC
            # (MariaDB / MySQL: Django's Now() is session-local time there).
            WorkflowWait.objects.filter(run_id=run_id, name="approval").update(due_at=db_now())
        WorkflowRun.objects.request_pass(run_id)
        run = drive(run_id)
        assert run is not None
        self.assertEqual(run.output, {"timed_out": True})

    def test_time_out_makes_an_event_timeout_pass(self) -> None:
        run_id = start_workflow("tests.drive.timeout", {})
        with self.assertRaisesMessage(ValueError, "has not reached a wait named 'approval'"):
            time_out(run_id, "approval")
        drive(run_id)
        with _session_zone_ahead_of_utc():
            wait = time_out(run_id, "approval")
        self.assertEqual(wait.status, WaitStatus.WAITING)
        self.assertTrue(wait.is_over())
        run = drive(run_id)
        assert run is not None
        self.assertEqual(run.output, {"timed_out": True})
        self.assertEqual(WorkflowWait.objects.get(run_id=run_id).status, WaitStatus.TIMED_OUT)
        with self.assertRaisesMessage(ValueError, "is timed_out, no longer waiting"):
            time_out(run_id, "approval")

    def test_time_out_refuses_a_wait_of_a_cancelled_run(self) -> None:
        """A cancelled run's wait still reads ``waiting``, but it is over: cutting it short
        is refused, as sending its event is, and nothing is written."""
        run_id = start_workflow("tests.drive.timeout", {})
        drive(run_id)
        WorkflowRun.objects.cancel(run_id)
        before = list(WorkflowWait.objects.values_list("name", "status", "due_at"))
        with self.assertRaisesMessage(WorkflowRunStateError, "is cancelled"):
            time_out(run_id, "approval")
        self.assertEqual(list(WorkflowWait.objects.values_list("name", "status", "due_at")), before)

    def test_time_out_refuses_what_has_no_time_to_move(self) -> None:
        run_id = start_workflow("tests.drive.everything", {})
        drive(run_id)  # waits for "approval", which has no timeout
        before = list(WorkflowWait.objects.values_list("name", "status", "due_at"))
        with self.assertRaisesMessage(ValueError, "without a timeout"):
            time_out(run_id, "approval")
        with self.assertRaisesMessage(ValueError, "is done, no longer waiting"):
            time_out(run_id, "a-day")
        with self.assertRaises(ValueError):
            time_out("not-a-run", "approval")
        with self.assertRaises(ValueError):
            time_out(run_id, "")
        self.assertEqual(list(WorkflowWait.objects.values_list("name", "status", "due_at")), before)

    def test_without_skip_sleeps_it_stops_at_the_sleep(self) -> None:
        run_id = start_workflow("tests.drive.everything", {})
        run = drive(run_id, skip_sleeps=False)
        assert run is not None
        self.assertEqual(run.status, RunStatus.RUNNING)
        self.assertFalse(WorkflowWait.objects.filter(run_id=run_id).exists(), "at the retry delay")

    def test_until_stops_the_drive(self) -> None:
        run_id = start_workflow("tests.drive.everything", {})
        drive(until=lambda: WorkflowWait.objects.filter(run_id=run_id, name="a-day").exists())
        self.assertFalse(WorkflowWait.objects.filter(run_id=run_id, name="approval").exists())

    def test_bad_arguments_are_refused(self) -> None:
        with self.assertRaises(WorkflowRun.DoesNotExist):
            drive("00000000-0000-0000-0000-000000000000")
        with self.assertRaises(ValueError):
            drive(max_units=0)

    def test_a_workflow_that_never_settles_is_reported(self) -> None:
        start_workflow("tests.drive.everything", {})
        with self.assertRaisesRegex(RuntimeError, "still due"):
            drive(max_units=2)

    def test_the_worker_command_refuses_and_points_at_drive(self) -> None:
        with self.assertRaisesRegex(CommandError, r"testing\.drive"):
            call_command("run_workflow_worker", "--once", verbosity=0)


# -- rate-limited queues ------------------------------------------------------------------------

#: A queue whose rate no test could wait out: two starts an hour.
RATED_QUEUE = "tests-drive-rated"


@workflow("tests.drive.rated")
def rated(run: Any, input: Any) -> Any:
    sums = run.parallel([(f"p{n}", "tests.drive.rated-add", {"a": n, "b": n}) for n in range(5)])
    last = run.step("last", "tests.drive.rated-add", {"a": sum(sums), "b": 0})
    return {"sums": sums, "last": last}


class DriveThroughRateLimits(TestCase):
    """A queue's ``rate`` holds steps back for its window; drive() jumps the window as it
    jumps sleeps (``skip_sleeps``), and with ``skip_sleeps=False`` stops with them waiting."""

    def setUp(self) -> None:
        from django.conf import settings
        from django.test import override_settings

        from django_leases.workflows import registry

        queues = {**settings.DJANGO_LEASES["QUEUES"], RATED_QUEUE: {"rate": "2/h"}}
        self.enterContext(
            override_settings(DJANGO_LEASES={**settings.DJANGO_LEASES, "QUEUES": queues})
        )
        # Registered for these tests only: other tests' settings do not configure the queue.
        step_function("tests.drive.rated-add", queue=RATED_QUEUE)(add)
        self.addCleanup(registry._step_functions.pop, "tests.drive.rated-add", None)
        self.addCleanup(registry._step_options.pop, "tests.drive.rated-add", None)

    def starts(self) -> list[float]:
        from django_leases.models.queue import WorkflowQueue

        return list(WorkflowQueue.objects.get(name=RATED_QUEUE).starts)

    def test_drive_jumps_the_rate_window_and_finishes_the_run(self) -> None:
        from django_leases.models.workflow import WorkflowStepAttempt

        run_id = start_workflow("tests.drive.rated", {})
        run = drive(run_id)
        assert run is not None
        self.assertEqual(run.status, RunStatus.COMPLETED)
        self.assertEqual(run.output, {"sums": [0, 2, 4, 6, 8], "last": 20})
        started = WorkflowStepAttempt.objects.filter(step__run_id=run_id)
        self.assertEqual(started.count(), 6, "six starts, in one hour of a 2/h queue")
        log = self.starts()
        self.assertEqual(len(log), 2, "the claims still record their starts")
        drive()  # nothing waits on the queue: its log is left alone
        self.assertEqual(self.starts(), log)

    def test_without_skip_sleeps_it_stops_with_the_steps_the_rate_holds_back(self) -> None:

        run_id = start_workflow("tests.drive.rated", {})
        run = drive(run_id, skip_sleeps=False)
        assert run is not None
        self.assertEqual(run.status, RunStatus.RUNNING)
        steps = dict(WorkflowStep.objects.filter(run_id=run_id).values_list("step_name", "status"))
        self.assertEqual(list(steps.values()).count(StepStatus.SUCCEEDED), 2)
        (row,) = [q for q in queue_overview() if q.name == RATED_QUEUE]
        self.assertEqual((row.waiting, row.rate), (3, "2/h"))
        self.assertEqual(len(self.starts()), 2)
        run = drive(run_id)
        assert run is not None
        self.assertEqual(run.status, RunStatus.COMPLETED)

    def test_the_rate_still_holds_within_one_window(self) -> None:
        # drive() claims through the queue's rule: two starts, then it has to jump.
        from django_leases.models.workflow import WorkflowStepAttempt

        run_id = start_workflow("tests.drive.rated", {})
        drive(run_id, skip_sleeps=False)
        drive(run_id, skip_sleeps=False)
        self.assertEqual(WorkflowStepAttempt.objects.filter(step__run_id=run_id).count(), 2)
