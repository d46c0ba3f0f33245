"""Queues (DESIGN §5b, issue 13 item 1): a step function names a queue; ``DJANGO_LEASES
["QUEUES"]`` gives it a cluster-wide ``concurrency`` and ``rate``, enforced in the claim on the
database; due steps are claimed by ``priority`` (FIFO within one); ``--queue`` picks what a
worker takes; a queue nobody configured is a system check error, a bad setting a clear one.

The limits are measured from the steps' own start and finish records (the attempt rows'
``started_at`` / ``finished_at``, on the database clock), with real worker processes."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks as django_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from django_leases.checks import check_leases_settings, check_step_queues
from django_leases.conf import parse_queues, queue_limits
from django_leases.exceptions import QueueConfigError
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.queue import WorkflowQueue
from django_leases.models.workflow import WorkflowStepAttempt
from django_leases.workflows import registry, start_workflow, step_function, workflow
from django_leases.workflows.display import queue_overview
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import NextStep, StepOptions
from django_leases.workflows.worker import Worker
from tests.helpers import (
    closing_connections,
    drain,
    in_processes,
    lapse_step_lease,
    race,
    settle,
    staff_client,
)

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES = {
    "tests-mail": {},
    "tests-other": {},
    "tests-limited": {"concurrency": 3},
    "tests-one": {"concurrency": 1},
    "tests-rated": {"rate": "20/s"},
}

#: name -> queue of the step functions :func:`queued` registers for a test.
FUNCTIONS = {
    "tests.queues.mail": "tests-mail",
    "tests.queues.other": "tests-other",
    "tests.queues.limited": "tests-limited",
    "tests.queues.one": "tests-one",
    "tests.queues.rated": "tests-rated",
}


def _work(data: Any, ctx: Any) -> Any:
    """A step that takes a little while (so that running steps overlap), then echoes."""
    time.sleep(float((data or {}).get("sleep", 0.0)))
    return {"step": ctx.step_name}


@pytest.fixture(autouse=True)
def queued() -> Iterator[None]:
    """Register the queued step functions for this test only (a module-level declaration
    would be reported by check E023 in other tests that replace ``DJANGO_LEASES``), with the
    queues configured."""
    with override_settings(DJANGO_LEASES={"QUEUES": QUEUES}):
        for name, queue in FUNCTIONS.items():
            step_function(name, queue=queue)(_work)
        step_function("tests.queues.urgent", queue="tests-mail", priority=7)(_work)
        try:
            yield
        finally:
            for name in [*FUNCTIONS, "tests.queues.urgent"]:
                registry._step_functions.pop(name, None)
                registry._step_options.pop(name, None)


@step_function("tests.queues.plain")
def plain(data: Any, ctx: Any) -> Any:
    """A step of the default queue."""
    return _work(data, ctx)


@workflow("tests.queues.idle")
def idle(run: Any, input: Any) -> Any:
    """A run whose steps the tests schedule by hand (its passes wait on them)."""
    return run.step("never", "tests.queues.plain", {})


@workflow("tests.queues.fan")
def fan(run: Any, input: dict[str, Any]) -> Any:
    """``n`` steps of step function ``function``, side by side."""
    calls = [
        (f"s{n}", input["function"], {"sleep": input.get("sleep", 0)}) for n in range(input["n"])
    ]
    return len(run.parallel(calls, retries=0))


@workflow("tests.queues.placed")
def placed(run: Any, input: Any) -> Any:
    """Steps whose queue and priority come from the declaration or the call."""
    run.parallel([("a", "tests.queues.mail", {}), ("b", "tests.queues.urgent", {})])
    run.step("c", "tests.queues.mail", {}, priority=9)
    return run.step("d", "tests.queues.one", {})


def _run() -> uuid.UUID:
    return start_workflow("tests.queues.idle", {})


def _schedule(run_id: uuid.UUID, name: str, function: str, **extra: Any) -> WorkflowStep:
    return WorkflowStep.objects.schedule(
        run_id, name, function, {}, queue=registry.step_declaration(function).queue, **extra
    )


def _claim_all(**kwargs: Any) -> list[str]:
    names = []
    while (claim := WorkflowStep.objects.claim_due(LEASE, **kwargs)) is not None:
        names.append(claim.step_name)
    return names


@pytest.fixture(params=[True, False], ids=["tuned", "portable"])
def tuned(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Both paths of the switch (they differ on PostgreSQL)."""
    with override_settings(DJANGO_LEASES={"QUEUES": QUEUES, "TUNED_SQL": request.param}):
        yield request.param


# -- priority and FIFO --------------------------------------------------------------------------


def test_due_steps_are_claimed_highest_priority_first_and_fifo_within_one(tuned: bool) -> None:
    run_id = _run()
    for name, priority in [("p0-a", 0), ("p5-a", 5), ("p0-b", 0), ("pm-a", -3), ("p5-b", 5)]:
        _schedule(run_id, name, "tests.queues.plain", priority=priority)
    assert _claim_all() == ["p5-a", "p5-b", "p0-a", "p0-b", "pm-a"]


def test_the_declaration_gives_queue_and_priority_and_the_call_overrides_it() -> None:
    run_id = start_workflow("tests.queues.placed", {})
    drain(Worker(step_lease_ttl=LEASE, queues=[]))
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    recorded = {
        s.step_name: (s.queue, s.priority) for s in WorkflowStep.objects.filter(run_id=run_id)
    }
    assert recorded == {
        "a": ("tests-mail", 0),
        "b": ("tests-mail", 7),
        "c": ("tests-mail", 9),
        "d": ("tests-one", 0),
    }


@pytest.mark.parametrize("priority", [True, 1.5, "1", 2**31])
def test_a_bad_priority_is_refused_before_anything_is_written(priority: Any) -> None:
    run_id = _run()
    with pytest.raises(ValueError, match="priority"):
        _schedule(run_id, "x", "tests.queues.plain", priority=priority)
    with pytest.raises(ValueError, match="priority"):
        step_function("tests.queues.bad-priority", priority=priority)
    assert not WorkflowStep.objects.filter(run_id=run_id, step_name="x").exists()


# -- --queue ------------------------------------------------------------------------------------


def test_a_worker_of_some_queues_takes_only_their_steps(tuned: bool) -> None:
    run_id = _run()
    for name, function in [
        ("m1", "tests.queues.mail"),
        ("o1", "tests.queues.other"),
        ("d1", "tests.queues.plain"),
        ("m2", "tests.queues.mail"),
    ]:
        _schedule(run_id, name, function)
    assert _claim_all(queues=["tests-mail"]) == ["m1", "m2"]
    assert _claim_all(queues=["default", "tests-other"]) == ["o1", "d1"]


def test_a_step_a_pass_schedules_in_another_queue_is_left_to_its_workers() -> None:
    run_id = start_workflow("tests.queues.placed", {})
    worker = Worker(step_lease_ttl=LEASE, queues=["default"])
    drain(worker)
    steps = WorkflowStep.objects.filter(run_id=run_id)
    assert set(steps.values_list("status", flat=True)) == {StepStatus.PENDING}
    drain(Worker(step_lease_ttl=LEASE, queues=["tests-mail", "tests-one"]))
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert WorkflowStepAttempt.objects.filter(step__run_id=run_id).count() == 4


def test_an_unknown_queue_for_a_worker_is_a_usage_error() -> None:
    with pytest.raises(QueueConfigError, match="nope"):
        Worker(queues=["nope"])
    with pytest.raises(CommandError, match="nope") as refused:
        call_command("run_workflow_worker", "--queue", "nope", "--once")
    assert refused.value.returncode == 2
    assert Worker(queues=["default", "tests-mail", "default"]).queues == ("default", "tests-mail")


# -- declaration and settings checks ------------------------------------------------------------


def test_a_step_function_on_an_unconfigured_queue_is_a_system_check_error() -> None:
    step_function("tests.queues.lost", queue="tests-nowhere")(_work)
    try:
        found = [
            message
            for message in django_checks.run_checks(tags=["django_leases"])
            if message.id == "django_leases.E023"
        ]
    finally:
        registry._step_functions.pop("tests.queues.lost")
        registry._step_options.pop("tests.queues.lost")
    assert len(found) == 1
    assert "tests.queues.lost" in found[0].msg and "tests-nowhere" in found[0].msg
    assert check_step_queues({"f": "default"}, {}) == [], '"default" is always known'


@pytest.mark.parametrize(
    ("queues", "problem"),
    [
        ({"q": {"concurrency": 0}}, "from 1 to"),
        ({"q": {"concurrency": -2}}, "from 1 to"),
        ({"q": {"concurrency": True}}, "from 1 to"),
        ({"q": {"concurrency": 1.5}}, "from 1 to"),
        ({"q": {"rate": "10"}}, '"N/s"'),
        ({"q": {"rate": "0/s"}}, '"N/s"'),
        ({"q": {"rate": "10/d"}}, '"N/s"'),
        ({"q": {"rate": 10}}, '"N/s"'),
        ({"q": {"limit": 1}}, "unknown key"),
        ({"q": 3}, "must be a dict"),
        ({"": {}}, "queue name"),
        (["q"], "must be a dict"),
    ],
)
def test_bad_queue_settings_are_clear_errors(queues: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_queues(queues)
    messages = check_leases_settings({"QUEUES": queues})
    assert [m.id for m in messages] == ["django_leases.E016"]
    assert problem in messages[0].msg
    with override_settings(DJANGO_LEASES={"QUEUES": queues}):
        with pytest.raises(ImproperlyConfigured, match=problem):
            queue_limits()
        with pytest.raises(QueueConfigError):
            WorkflowStep.objects.claim_due(LEASE)


def test_good_queue_settings_parse() -> None:
    limits = parse_queues({"a": {"concurrency": 2, "rate": "600/m"}, "b": {"rate": "3600/h"}})
    assert set(limits) == {"default", "a", "b"}
    assert (limits["a"].concurrency, limits["a"].rate_starts, limits["a"].rate_window) == (
        2,
        600,
        60.0,
    )
    assert (limits["b"].concurrency, limits["b"].rate_window) == (None, 3600.0)
    assert not limits["default"].limited


def test_the_limits_follow_the_setting_through_overrides_and_changes_in_place() -> None:
    """The parsed limits are kept between calls (the worker asks twice per step), but the
    setting is read each time: an override, a dict changed in place and a setting made bad
    are all seen at the next call, and a caller changing what it got changes nothing."""
    outside = set(queue_limits())
    queues: dict[str, Any] = {"a": {"concurrency": 2}}
    with override_settings(DJANGO_LEASES={"QUEUES": queues}):
        first = queue_limits()
        assert first["a"].concurrency == 2
        first.pop("a")
        assert queue_limits()["a"].concurrency == 2
        queues["a"]["concurrency"] = 3  # in place: the same dict
        assert queue_limits()["a"].concurrency == 3
        queues["b"] = {"rate": "5/s"}
        assert set(queue_limits()) == {"default", "a", "b"}
        queues["b"]["rate"] = "five"
        with pytest.raises(QueueConfigError, match="rate"):
            queue_limits()
        with pytest.raises(QueueConfigError, match="rate"):
            queue_limits()
        with override_settings(DJANGO_LEASES={"QUEUES": {"c": {}}}):
            assert set(queue_limits()) == {"default", "c"}
    assert set(queue_limits()) == outside


# -- the limits, one claimer --------------------------------------------------------------------


def test_a_queue_at_its_concurrency_takes_no_more_until_a_step_finishes(tuned: bool) -> None:
    run_id = _run()
    for n in range(3):
        _schedule(run_id, f"one-{n}", "tests.queues.one")
    _schedule(run_id, "free", "tests.queues.plain")
    first = WorkflowStep.objects.claim_due(LEASE)
    assert first is not None and first.step_name == "one-0"
    assert _claim_all() == ["free"], "the full queue is passed over, not waited on"
    assert (
        WorkflowStep.objects.claim_for_execution(run_id, "one-1", "tests.queues.one", LEASE) is None
    )
    execute_step(first)
    assert _claim_all() == ["one-1"]


def test_a_running_step_whose_lease_lapsed_does_not_count(tuned: bool) -> None:
    run_id = _run()
    _schedule(run_id, "one-0", "tests.queues.one")
    _schedule(run_id, "one-1", "tests.queues.one")
    assert WorkflowStep.objects.claim_due(LEASE) is not None
    assert WorkflowStep.objects.claim_due(LEASE) is None
    lapse_step_lease(run_id=run_id, step_name="one-0")
    again = WorkflowStep.objects.claim_due(LEASE)
    assert again is not None, "the lapsed step's slot is free"
    assert WorkflowStep.objects.claim_due(LEASE) is None


def test_a_queue_out_of_its_rate_takes_no_more_starts_in_the_window(tuned: bool) -> None:
    run_id = _run()
    queues = {**QUEUES, "tests-rated": {"rate": "3/h"}}
    with override_settings(DJANGO_LEASES={"QUEUES": queues, "TUNED_SQL": tuned}):
        for n in range(5):
            _schedule(run_id, f"r{n}", "tests.queues.rated")
        _schedule(run_id, "free", "tests.queues.plain")
        assert sorted(_claim_all()) == ["free", "r0", "r1", "r2"]
        log = WorkflowQueue.objects.get(name="tests-rated").starts
        started = WorkflowStepAttempt.objects.filter(step__queue="tests-rated")
        assert len(log) == 3 == started.count()
        # Starts older than the window no longer count (moved back on the database's terms).
        WorkflowQueue.objects.filter(name="tests-rated").update(
            starts=[t - 3601 for t in log[:2]] + log[2:]
        )
        assert sorted(_claim_all()) == ["r3", "r4"]


# -- the limits, many workers -------------------------------------------------------------------


def _intervals(queue: str) -> list[tuple[Any, Any]]:
    """The ``(started_at, finished_at)`` of each attempt of ``queue``'s steps. An attempt
    never finished (a write a busy SQLite refused ended its unit; its lease was lapsed and
    the step taken over) ends where its step's next attempt started."""
    rows = WorkflowStepAttempt.objects.filter(step__queue=queue).order_by("step_id", "attempt")
    found = []
    attempts = list(rows.values_list("step_id", "started_at", "finished_at"))
    for (step_id, started, finished), after in zip(attempts, [*attempts[1:], None], strict=True):
        if finished is None and after is not None and after[0] == step_id:
            finished = after[1]
        found.append((started, finished))
    return found


def _most_at_once(intervals: list[tuple[Any, Any]]) -> int:
    """The most intervals open at one moment (a finish at the moment of a start is before
    it: the step no longer ran)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def _workers(processes: int, threads: int) -> list[tuple[Any, str]]:
    def work() -> int:
        return Worker(threads, step_lease_ttl=LEASE, poll_interval=0.05).run(
            once=True, handle_signals=False
        )

    return in_processes([work] * processes, timeout=300.0)


def test_racing_first_claims_of_a_limited_queue_take_its_limit_without_deadlock() -> None:
    """Eight claims race for a limited queue that has no row yet: each creates the row or
    waits for the claim that does, none fails (InnoDB deadlocked two claims whose ignored
    inserts each held a shared lock on the new row), and the limit holds."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: there is no race to lose")
    assert not WorkflowQueue.objects.filter(name="tests-limited").exists()
    run_id = _run()
    for n in range(20):
        _schedule(run_id, f"c{n}", "tests.queues.limited")

    @closing_connections
    def claimer() -> list[int]:
        claims = (WorkflowStep.objects.claim_due(60, queues=["tests-limited"]) for _ in range(3))
        return [claim.step_id for claim in claims if claim is not None]

    found = race([claimer] * 8)
    assert all(isinstance(claimed, list) for claimed in found), found
    assert sum(len(claimed) for claimed in found) == 3


def test_four_workers_of_four_threads_never_run_more_than_the_concurrency() -> None:
    run_id = start_workflow(
        "tests.queues.fan", {"n": 40, "function": "tests.queues.limited", "sleep": 0.05}
    )
    assert _workers(4, 4) == [(0, "")] * 4
    settle(run_id)
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    succeeded = WorkflowStepAttempt.objects.filter(step__queue="tests-limited", status="succeeded")
    assert succeeded.count() == 40
    intervals = _intervals("tests-limited")
    assert all(end is not None for _, end in intervals)
    assert 1 <= _most_at_once(intervals) <= 3


def test_four_workers_never_start_more_than_the_rate_in_any_window() -> None:
    run_id = start_workflow("tests.queues.fan", {"n": 100, "function": "tests.queues.rated"})
    assert _workers(4, 2) == [(0, "")] * 4
    settle(run_id)
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    succeeded = WorkflowStepAttempt.objects.filter(step__queue="tests-rated", status="succeeded")
    assert succeeded.count() == 100
    # Every attempt's start counts against the rate (one taken over after a refused write too).
    starts = sorted(start for start, _ in _intervals("tests-rated"))
    window = timedelta(seconds=1)
    for index, start in enumerate(starts):
        within = sum(1 for other in starts[index:] if other < start + window)
        assert within <= 20, f"{within} starts in the second from {start}"


# -- the operators' view ------------------------------------------------------------------------


def test_the_overview_counts_waiting_and_running_with_the_limits() -> None:
    run_id = _run()
    for n in range(3):
        _schedule(run_id, f"one-{n}", "tests.queues.one")
    _schedule(run_id, "m", "tests.queues.mail")
    assert WorkflowStep.objects.claim_due(LEASE, queues=["tests-one"]) is not None
    rows = {row.name: row for row in queue_overview()}
    assert set(QUEUES) | {"default"} <= set(rows)
    one = rows["tests-one"]
    assert (one.waiting, one.running, one.concurrency, one.rate) == (2, 1, 1, None)
    assert one.oldest_waiting is not None and one.oldest_waiting >= 0
    assert (rows["tests-mail"].waiting, rows["tests-mail"].running) == (1, 0)
    assert rows["tests-rated"].rate == "20/s"
    assert rows["tests-rated"].oldest_waiting is None
    assert rows["default"].configured


def test_the_admin_queue_view_shows_the_overview_to_viewers_only() -> None:
    run_id = _run()
    _schedule(run_id, "one-0", "tests.queues.one")
    _schedule(run_id, "one-1", "tests.queues.one")
    assert WorkflowStep.objects.claim_due(LEASE, queues=["tests-one"]) is not None
    url = reverse("admin:django_leases_workflowqueue_changelist")
    assert staff_client().get(url).status_code == 403
    page = staff_client("view_workflowqueue").get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="queue-tests-one" data-waiting="1" data-running="1"' in html
    assert "20/s" in html and 'id="queue-default"' in html


def test_workflow_queues_lists_the_overview_as_a_table_or_json() -> None:
    run_id = _run()
    _schedule(run_id, "m", "tests.queues.mail")
    out = io.StringIO()
    call_command("workflow_queues", "list", "--format", "json", stdout=out)
    rows = {row["name"]: row for row in json.loads(out.getvalue())}
    assert rows["tests-mail"]["waiting"] == 1
    assert rows["tests-limited"]["concurrency"] == 3
    assert rows["tests-rated"]["rate"] == "20/s"
    out = io.StringIO()
    call_command("workflow_queues", "list", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAME", "WAITING", "RUNNING", "LIMIT", "RATE", "OLDEST", "WAITING"]
    assert any(line.startswith("tests-mail ") for line in lines)


def test_a_step_a_pass_schedules_and_claims_itself_obeys_its_queue(tuned: bool) -> None:
    run_id = _run()
    _schedule(run_id, "busy", "tests.queues.one")
    assert WorkflowStep.objects.claim_due(LEASE) is not None
    run = WorkflowRun.objects.get(pk=run_id)
    full = WorkflowStep.objects.schedule_claimed(
        run_id,
        NextStep("next", "tests.queues.one", {}, StepOptions(queue="tests-one")),
        lease_ttl_seconds=LEASE,
        finish_pass=run.pass_requests,
    )
    assert full.claim is None, "the queue is at its concurrency: the step waits"
    assert WorkflowStep.objects.get(run_id=run_id, step_name="next").status == StepStatus.PENDING
    free = WorkflowStep.objects.schedule_claimed(
        run_id,
        NextStep("mail", "tests.queues.mail", {}, StepOptions(queue="tests-mail", priority=3)),
        lease_ttl_seconds=LEASE,
        finish_pass=run.pass_requests,
    )
    assert free.claim is not None
    assert (free.step.queue, free.step.priority) == ("tests-mail", 3)


def test_the_steps_gauge_is_labelled_with_each_steps_queue() -> None:
    pytest.importorskip("prometheus_client")
    from django_leases.metrics import PREFIX
    from django_leases.metrics_collector import DatabaseCollector

    run_id = _run()
    _schedule(run_id, "m", "tests.queues.mail")
    _schedule(run_id, "d", "tests.queues.plain")
    collector = DatabaseCollector(PREFIX)
    steps = next(family for family in collector.collect() if family.name.endswith("_steps"))
    found = {
        (sample.labels["queue"], sample.labels["status"]): sample.value for sample in steps.samples
    }
    assert found[("tests-mail", "pending")] == 1
    assert found[("default", "pending")] == 1
    assert found[("default", "running")] == 0


def test_a_worker_refuses_to_start_on_unusable_queue_settings() -> None:
    broken = override_settings(DJANGO_LEASES={"QUEUES": {"q": {"concurrency": 0}}})
    with broken, pytest.raises(CommandError, match="from 1 to") as refused:
        call_command("run_workflow_worker", "--once")
    assert refused.value.returncode == 1
