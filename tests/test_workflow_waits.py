"""Durable waits (DESIGN §5a): ``run.sleep`` and ``run.wait_for_event`` / ``send_event``.

A wait is a row, recorded when a pass first reaches it; a pass that reaches it again returns
its recorded outcome or ends there. No worker thread sleeps: a sleeping run's next pass is
due at the sleep's end, on the database clock. Time is never waited for here: a sleep or a
timeout is made to have passed by moving its ``due_at`` into the past on the database clock.
"""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from django_leases.clock import db_now, db_now_plus
from django_leases.exceptions import (
    WorkflowEventRefusedError,
    WorkflowEventTimeout,
    WorkflowRunStateError,
)
from django_leases.models import RunStatus, WorkflowRun, WorkflowWait
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.values import WORKFLOW_ERROR, WaitKind, WaitStatus
from tests.helpers import drain, race, race_in_processes, run_of

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0


@step_function("tests.waits.echo")
def echo(data: Any, ctx: Any) -> Any:
    return data


#: Values JSON input cannot carry, by name.
BAD = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "neg": -1, "str": "10", "bool": True}


def _seconds(value: Any) -> Any:
    return BAD[value] if isinstance(value, str) and value in BAD else value


@workflow("tests.waits.nap")
def nap(run: Any, input: dict[str, Any]) -> Any:
    before = run.step("before", "tests.waits.echo", "before")
    run.sleep("nap", _seconds(input["seconds"]))
    after = run.step("after", "tests.waits.echo", "after")
    return [before, after]


@workflow("tests.waits.approval")
def approval(run: Any, input: dict[str, Any]) -> Any:
    try:
        decision = run.wait_for_event("approved", timeout=_seconds(input.get("timeout")))
    except WorkflowEventTimeout as exc:
        return {"timed_out": exc.name}
    return {"decision": decision}


@workflow("tests.waits.kind-clash")
def kind_clash(run: Any, input: Any) -> Any:
    # A step first: the pass reaches the sleep carrying its result (written with the sleep).
    run.step("first", "tests.waits.echo", 1)
    if input.get("child"):
        return run.child("approved", "tests.waits.nap", {"seconds": 0})
    run.sleep("approved", 3600)
    return "slept"


@workflow("tests.waits.same-name")
def same_name(run: Any, input: Any) -> Any:
    run.step("x", "tests.waits.echo", 1)
    run.sleep("x", 1)
    return None


def wait_of(run_id: uuid.UUID, name: str) -> WorkflowWait:
    return WorkflowWait.objects.get(run_id=run_id, name=name)


def elapse(run_id: uuid.UUID, name: str) -> None:
    """Make wait ``name``'s due time a second ago on the database clock, and the run's next
    pass due with it (as the sleep's end would have made it)."""
    assert WorkflowWait.objects.filter(run_id=run_id, name=name).update(due_at=db_now_plus(-1))
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=db_now_plus(-1))


# -- run.sleep -----------------------------------------------------------------------------------


def test_a_sleep_is_recorded_once_and_the_next_pass_is_due_at_its_end() -> None:
    run_id = start_workflow("tests.waits.nap", {"seconds": 3600})
    drain()
    run = run_of(run_id)
    wait = wait_of(run_id, "nap")
    assert (run.status, wait.kind, wait.status) == (RunStatus.RUNNING, WaitKind.SLEEP, "waiting")
    assert run.pass_due_at == wait.due_at, "the next pass is due when the sleep ends"
    assert wait.due_at is not None
    ahead = WorkflowWait.objects.filter(
        pk=wait.pk, due_at__gt=db_now_plus(3590), due_at__lte=db_now_plus(3600)
    )
    assert ahead.exists(), "the end is database now + seconds"
    assert not WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()
    # Another pass (asked for by anything) replays the sleep without recomputing its end,
    # and puts the next pass back at that end.
    WorkflowRun.objects.request_pass(run_id)
    assert run_pass(run_id) == "waiting"
    assert wait_of(run_id, "nap").due_at == wait.due_at
    assert run_of(run_id).pass_due_at == wait.due_at
    elapse(run_id, "nap")
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, ["before", "after"])
    assert wait_of(run_id, "nap").status == WaitStatus.DONE


def test_a_zero_second_sleep_passes_on_the_next_pass() -> None:
    run_id = start_workflow("tests.waits.nap", {"seconds": 0})
    drain()
    assert run_of(run_id).status == RunStatus.COMPLETED


@pytest.mark.parametrize("bad", [*BAD, None])
def test_bad_sleep_seconds_fail_the_run_clearly_and_record_no_wait(bad: Any) -> None:
    run_id = start_workflow("tests.waits.nap", {"seconds": bad})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == WORKFLOW_ERROR and "sleep 'nap'" in run.error["message"]
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


def test_a_wait_name_reached_as_another_kind_fails_the_run_and_writes_nothing() -> None:
    """A name the run reached as one kind of wait (the code changed between passes) fails
    the run when a pass reaches it as another: its recorded outcome is not that kind's."""
    run = WorkflowRun.objects.start("tests.waits.approval", {})
    WorkflowWait.objects.reach(run.id, "approved", WaitKind.SLEEP, seconds=3600)
    before = list(WorkflowWait.objects.filter(run_id=run.id).values())
    drain()
    failed = run_of(run.id)
    assert failed.status == RunStatus.FAILED
    assert "recorded as a sleep wait" in failed.error["message"]
    assert list(WorkflowWait.objects.filter(run_id=run.id).values()) == before


def test_an_early_event_named_like_a_later_sleep_yields_the_name_to_the_sleep(
    sql_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An event sent before the run reached any wait of its name was kept for a
    ``wait_for_event`` of that name; the run reaches a ``run.sleep`` of that name instead.
    The kept event, never delivered, is dropped (logged) and the sleep proceeds: the run
    does not fail, and the event is never delivered (nor is a later one)."""
    run_id = start_workflow("tests.waits.kind-clash", {})
    send_event(run_id, "approved", {"by": "ops"})
    with caplog.at_level("WARNING", logger="django_leases.workflows"):
        drain()
    run = run_of(run_id)
    assert run.status == RunStatus.RUNNING, run.error
    wait = wait_of(run_id, "approved")
    assert (wait.kind, wait.status, wait.payload) == (WaitKind.SLEEP, WaitStatus.WAITING, None)
    assert wait.reached_at is not None and run.pass_due_at == wait.due_at
    assert WorkflowWait.objects.filter(
        pk=wait.pk, due_at__gt=db_now_plus(3590), due_at__lte=db_now_plus(3600)
    ).exists(), "the sleep's end is counted from the pass that reached it"
    [dropped] = [r for r in caplog.records if "never delivered" in r.getMessage()]
    assert str(run_id) in dropped.getMessage() and "'approved'" in dropped.getMessage()
    with pytest.raises(WorkflowEventRefusedError, match="sleep wait"):
        send_event(run_id, "approved", {"by": "ops, again"})
    elapse(run_id, "approved")
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "slept")
    assert WorkflowWait.objects.filter(run_id=run_id).count() == 1


def test_an_early_event_named_like_a_later_child_yields_the_name_to_the_child(
    sql_path: str,
) -> None:
    run_id = start_workflow("tests.waits.kind-clash", {"child": True})
    send_event(run_id, "approved", {"by": "ops"})
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, ["before", "after"]), run.error
    wait = wait_of(run_id, "approved")
    assert (wait.kind, wait.status, wait.payload) == (WaitKind.CHILD, WaitStatus.DONE, None)
    assert WorkflowRun.objects.get(parent_id=run_id).pk == wait.child_id


def test_a_step_and_a_wait_cannot_share_a_name() -> None:
    run_id = start_workflow("tests.waits.same-name", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED and "used twice" in run.error["message"]


# -- wait_for_event / send_event -----------------------------------------------------------------


def test_an_event_sent_to_a_waiting_run_wakes_it_with_its_payload() -> None:
    run_id = start_workflow("tests.waits.approval", {})
    drain()
    wait = wait_of(run_id, "approved")
    assert (wait.kind, wait.status, wait.due_at) == (WaitKind.EVENT, "waiting", None)
    assert run_of(run_id).pass_due_at is None, "no timeout: nothing is due until the event"
    send_event(run_id, "approved", {"by": "alice"})
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"decision": {"by": "alice"}})


def test_an_event_sent_before_the_run_reaches_the_wait_is_kept_and_consumed() -> None:
    run = WorkflowRun.objects.start("tests.waits.approval", {})
    send_event(run.id, "approved", ["early"])
    kept = wait_of(run.id, "approved")
    assert (kept.status, kept.reached_at, kept.payload) == (WaitStatus.DONE, None, ["early"])
    drain()
    assert (run_of(run.id).status, run_of(run.id).output) == ("completed", {"decision": ["early"]})
    assert wait_of(run.id, "approved").reached_at is not None


def test_a_second_event_for_a_satisfied_wait_is_refused_and_changes_nothing() -> None:
    run_id = start_workflow("tests.waits.approval", {})
    drain()
    send_event(run_id, "approved", 1)
    before = list(WorkflowWait.objects.filter(run_id=run_id).values())
    requests = run_of(run_id).pass_requests
    with pytest.raises(WorkflowEventRefusedError, match="already sent"):
        send_event(run_id, "approved", 2)
    assert list(WorkflowWait.objects.filter(run_id=run_id).values()) == before
    assert run_of(run_id).pass_requests == requests


def test_an_event_to_an_unknown_or_finished_run_is_refused_with_nothing_stored() -> None:
    with pytest.raises(WorkflowRun.DoesNotExist):
        send_event(uuid.uuid4(), "approved", {})
    with pytest.raises(ValueError, match="run id"):
        send_event("not-a-run", "approved", {})
    done = start_workflow("tests.waits.nap", {"seconds": 0})
    drain()
    with pytest.raises(WorkflowRunStateError, match="completed"):
        send_event(done, "approved", {})
    cancelled = start_workflow("tests.waits.approval", {})
    WorkflowRun.objects.cancel(cancelled)
    with pytest.raises(WorkflowRunStateError, match="cancelled"):
        send_event(cancelled, "approved", {})
    assert not WorkflowWait.objects.filter(run_id__in=[done, cancelled], name="approved").exists()


def test_bad_event_names_and_payloads_are_refused_with_nothing_stored() -> None:
    run_id = start_workflow("tests.waits.approval", {})
    with pytest.raises(ValueError, match="JSON"):
        send_event(run_id, "approved", {"when": object()})
    with pytest.raises(ValueError):
        send_event(run_id, "", {})
    with pytest.raises(ValueError):
        send_event(run_id, "x" * 1000, {})
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


def test_an_event_payload_over_the_limit_is_refused_with_nothing_stored(settings: Any) -> None:
    """``DJANGO_LEASES["MAX_EVENT_PAYLOAD"]`` bytes of compact UTF-8 JSON at most (1 MiB by
    default): a larger payload is a ``ValueError`` naming the setting, nothing written, for
    a waiting run and for an early event alike."""
    waiting = start_workflow("tests.waits.approval", {})
    drain()
    early = WorkflowRun.objects.start("tests.waits.approval", {}).id
    requests = {run_id: run_of(run_id).pass_requests for run_id in (waiting, early)}
    over = {"blob": "x" * (1024 * 1024)}  # over 1 MiB: the default limit
    for run_id in (waiting, early):
        with pytest.raises(ValueError, match="1048587 bytes of JSON, over the limit of 1048576"):
            send_event(run_id, "approved", over)
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "MAX_EVENT_PAYLOAD": 10}
    for run_id in (waiting, early):
        with pytest.raises(ValueError, match="MAX_EVENT_PAYLOAD"):
            send_event(run_id, "approved", ["é" * 4])  # 12 bytes: ["éééé"] in UTF-8
        assert run_of(run_id).pass_requests == requests[run_id]
    assert wait_of(waiting, "approved").status == WaitStatus.WAITING
    assert not WorkflowWait.objects.filter(run_id=early).exists()
    send_event(waiting, "approved", ["é" * 3])  # 10 bytes: at the limit
    send_event(early, "approved", {"a": [1]})  # {"a":[1]}: 9 bytes
    drain()
    assert run_of(waiting).output == {"decision": ["ééé"]}
    assert run_of(early).output == {"decision": {"a": [1]}}


def test_an_event_payload_deeper_than_the_database_stores_is_a_value_error() -> None:
    """MariaDB's JSON columns refuse 32 levels of nesting (``CHECK (JSON_VALID(...))``):
    there such a payload is a ``ValueError`` with nothing stored, not the database's
    ``IntegrityError``; the other databases store it (up to the package's 100 levels)."""
    mariadb = connection.vendor == "mysql" and connection.mysql_is_mariadb
    run_id = start_workflow("tests.waits.approval", {})

    def nested(levels: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(levels - 1):
            value = [value]
        return value

    send_event(run_id, "thirty-one", nested(31))
    assert wait_of(run_id, "thirty-one").payload == nested(31)
    if mariadb:
        with pytest.raises(ValueError, match="nests deeper than 31 levels"):
            send_event(run_id, "thirty-two", nested(32))
        assert not WorkflowWait.objects.filter(run_id=run_id, name="thirty-two").exists()
    else:
        send_event(run_id, "thirty-two", nested(32))
        assert wait_of(run_id, "thirty-two").payload == nested(32)
    with pytest.raises(ValueError, match="nests deeper than"):
        send_event(run_id, "deeper", nested(101))


@pytest.mark.parametrize("bad", [0, -1, "1MB", 1.5, True, None])
def test_an_unusable_payload_limit_is_a_configuration_error(settings: Any, bad: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    run_id = start_workflow("tests.waits.approval", {})
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "MAX_EVENT_PAYLOAD": bad}
    with pytest.raises(ImproperlyConfigured, match="MAX_EVENT_PAYLOAD"):
        send_event(run_id, "approved", 1)
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


def test_an_event_to_another_kind_of_wait_is_refused() -> None:
    run_id = start_workflow("tests.waits.nap", {"seconds": 3600})
    drain()
    with pytest.raises(WorkflowEventRefusedError, match="sleep wait"):
        send_event(run_id, "nap", {})
    assert wait_of(run_id, "nap").status == WaitStatus.WAITING


def test_a_suspended_run_keeps_an_event_for_when_it_is_resumed() -> None:
    run_id = start_workflow("tests.waits.approval", {})
    drain()
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.SUSPENDED)
    send_event(run_id, "approved", "yes")
    WorkflowRun.objects.resume(run_id)
    drain()
    assert run_of(run_id).output == {"decision": "yes"}


def test_a_timeout_raises_inside_the_workflow_and_a_late_event_is_refused() -> None:
    run_id = start_workflow("tests.waits.approval", {"timeout": 600})
    drain()
    wait = wait_of(run_id, "approved")
    assert wait.due_at is not None and run_of(run_id).pass_due_at == wait.due_at
    elapse(run_id, "approved")
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"timed_out": "approved"})
    assert wait_of(run_id, "approved").status == WaitStatus.TIMED_OUT
    # A replay sees the recorded timeout again (the run is finished here, but the wait's
    # outcome is what any later pass would read).
    with pytest.raises(WorkflowRunStateError):
        send_event(run_id, "approved", {})


def test_an_event_after_its_timeout_passed_is_refused_even_before_a_pass_saw_it() -> None:
    """The timeout is judged on the database clock, not on when a worker got round to it
    (as a lapsed lease cannot be refreshed though nobody took it): an event sent once the
    timeout has passed is refused and changes nothing, and the run times out."""
    run_id = start_workflow("tests.waits.approval", {"timeout": 600})
    drain()
    elapse(run_id, "approved")
    before = list(WorkflowWait.objects.filter(run_id=run_id).values())
    with pytest.raises(WorkflowEventRefusedError, match="timed out"):
        send_event(run_id, "approved", "too late")
    assert list(WorkflowWait.objects.filter(run_id=run_id).values()) == before
    drain()
    assert run_of(run_id).output == {"timed_out": "approved"}
    assert wait_of(run_id, "approved").status == WaitStatus.TIMED_OUT


@pytest.mark.parametrize("bad", ["neg", "inf", "nan", "str", "bool"])
def test_a_bad_timeout_fails_the_run_clearly(bad: Any) -> None:
    run_id = start_workflow("tests.waits.approval", {"timeout": bad})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED and "Timeout of event" in run.error["message"]
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


def test_timedelta_seconds_are_accepted() -> None:
    run = WorkflowRun.objects.start("tests.waits.nap", {"seconds": 0})
    wait = WorkflowWait.objects.reach(run.id, "t", WaitKind.SLEEP, seconds=timedelta(minutes=5))
    assert WorkflowWait.objects.filter(pk=wait.pk, due_at__gt=db_now()).exists()


# -- races ---------------------------------------------------------------------------------------


def test_eight_processes_sending_the_same_event_deliver_it_exactly_once() -> None:
    run_id = start_workflow("tests.waits.approval", {})
    drain()

    def sender(n: int) -> Any:
        def send() -> Any:
            send_event(run_id, "approved", {"sender": n})
            return n

        return send

    outcomes = race_in_processes(*(sender(n) for n in range(8)))
    accepted = [value for value, error in outcomes if not error]
    refused = [error for _, error in outcomes if error]
    assert len(accepted) == 1, outcomes
    assert all("WorkflowEventRefusedError" in e and "already sent" in e for e in refused)
    drain()
    assert run_of(run_id).output == {"decision": {"sender": accepted[0]}}


@pytest.mark.postgres_only
def test_an_event_racing_its_timeout_has_exactly_one_outcome() -> None:
    """The event's send and the pass that records the timeout race on two threads once the
    timeout has passed on the database clock: whichever runs first, the send is refused
    (by the clock, or by the recorded timeout) and the run times out once."""
    for _ in range(10):
        run_id = start_workflow("tests.waits.approval", {"timeout": 600})
        drain()
        elapse(run_id, "approved")
        sent, _ = race(
            [lambda run_id=run_id: send_event(run_id, "approved", "won"), lambda: drain()]
        )
        drain()
        assert isinstance(sent, WorkflowEventRefusedError | WorkflowRunStateError), sent
        assert run_of(run_id).output == {"timed_out": "approved"}
        wait = wait_of(run_id, "approved")
        assert (wait.status, wait.payload) == (WaitStatus.TIMED_OUT, None)
