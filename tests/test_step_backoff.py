"""Retry backoff: a step's retry delay grows by ``retry_backoff`` per attempt up to
``retry_delay_max`` (``min(retry_delay × retry_backoff^(n − 1), retry_delay_max or one
day)`` after attempt n fails), on the database clock, on both paths of the SQL switch.

The rule itself, its overflow guard and the checks of its arguments are tested as functions;
then every way a step is created (``run.step`` — whose step PostgreSQL's tuned path inserts
already claimed —, ``run.parallel``, ``schedule``, ``schedule_claimed``, ``start_one_step``)
records the backoff, a pass reads it back, and the delays land where the rule says. Nothing
waits: a retry is made due by moving its ``available_at`` on the database clock.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any
from unittest import mock

import pytest
from django.db import connection

from django_leases.clock import DbNow, db_now_plus
from django_leases.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    scheduling,
    workflow_base,
)
from django_leases.models.workflow import retry_delay_after
from django_leases.testing import drive
from django_leases.validation import MAX_RETRY_DELAY, check_backoff
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import RunDriver
from django_leases.workflows.values import STEP_FAILED, WORKFLOW_ERROR, NextStep, StepOptions
from tests.helpers import no_queue_limits

FAILS = "tests.backoff.fails"
LEASE = 60.0
#: The example of the docs: 10 s, doubled each time, at most 30 s, three retries.
BACKOFF = {"retries": 3, "retry_delay": 10, "retry_backoff": 2, "retry_delay_max": 30}


@step_function(FAILS)
def fails(data: Any, ctx: Any) -> None:
    raise RuntimeError(f"attempt {ctx.attempt} fails")


def _arguments(input: dict[str, Any]) -> dict[str, Any]:
    """The run's input as keyword arguments; ``"nan"`` stands for NaN (JSON has none)."""
    return {key: math.nan if value == "nan" else value for key, value in input.items()}


@workflow("tests.backoff.step")
def one_step(run: Any, input: dict[str, Any]) -> Any:
    return run.step("work", FAILS, {}, **_arguments(input))


@workflow("tests.backoff.parallel")
def fan_out(run: Any, input: dict[str, Any]) -> Any:
    return run.parallel([("a", FAILS, {}), ("b", FAILS, {})], **_arguments(input))


def db_clock(run_id: uuid.UUID) -> datetime:
    """The database clock's now, read with the row of run ``run_id``."""
    now: datetime = (
        WorkflowRun.objects.filter(pk=run_id).annotate(now=DbNow()).values_list("now", flat=True)
    ).get()
    return now


def assert_due_after(step: WorkflowStep, before: datetime, after: datetime, delay: float) -> None:
    """``step``'s next attempt is due ``delay`` seconds after a failure written between
    ``before`` and ``after`` (database clock readings)."""
    wait = timedelta(seconds=delay)
    assert step.available_at is not None, "no retry due"
    assert before + wait <= step.available_at <= after + wait, (
        step.available_at - before,
        step.available_at - after,
    )


def make_due(run_id: uuid.UUID) -> None:
    """The run's waiting retries due a second ago, on the database clock."""
    WorkflowStep.objects.filter(run_id=run_id, status=StepStatus.FAILED).update(
        available_at=db_now_plus(-1)
    )


# -- the rule -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "cap", "delays"),
    [
        (1.0, None, [10, 10, 10, 10]),  # the default: constant, as before backoffs
        (2.0, 30.0, [10, 20, 30, 30]),
        (3.0, None, [10, 30, 90, 270]),
        (2.0, 5.0, [5, 5, 5, 5]),  # a cap below retry_delay caps the first delay too
        (2.0, 0.0, [0, 0, 0, 0]),  # a cap of 0 s: every retry at once
        (1.5, None, [10, 15, 22.5, 33.75]),
    ],
)
def test_the_delay_after_each_attempt(
    backoff: float, cap: float | None, delays: list[float]
) -> None:
    got = [retry_delay_after(attempt, 10.0, backoff, cap) for attempt in (1, 2, 3, 4)]
    assert got == delays


def test_without_a_cap_of_its_own_the_delay_stops_at_one_day() -> None:
    assert retry_delay_after(14, 10.0, 2.0) == 10 * 2**13  # 81,920 s
    assert retry_delay_after(15, 10.0, 2.0) == MAX_RETRY_DELAY
    assert retry_delay_after(2, 50_000.0, 2.0, None) == MAX_RETRY_DELAY


def test_no_delay_stays_no_delay_whatever_the_backoff() -> None:
    assert retry_delay_after(1, 0.0, 1e308, None) == 0.0
    assert retry_delay_after(1001, 0.0, 2.0, 30.0) == 0.0


@pytest.mark.parametrize(
    ("attempt", "retry_delay", "backoff"),
    [
        (1001, 10.0, 2.0),  # 2 ** 1000 is a float, 10 × it is not below the cap
        (1001, 10.0, 1e308),  # 1e308 ** 1000 overflows a float
        (3, 10.0, 1e200),
        (1001, 5e-324, 1e308),  # a subnormal delay does not save it
        (2, 86_400.0, 1.0000001),
    ],
)
def test_a_huge_growth_is_capped_without_overflowing(
    attempt: int, retry_delay: float, backoff: float
) -> None:
    assert retry_delay_after(attempt, retry_delay, backoff, None) == MAX_RETRY_DELAY
    assert retry_delay_after(attempt, retry_delay, backoff, 300.0) == 300.0


def test_a_subnormal_delay_grown_past_a_float_is_computed_in_logarithms() -> None:
    # 1e156 ** 2 overflows a float, yet 5e-324 × 1e312 is far below the cap.
    delay = retry_delay_after(3, 5e-324, 1e156, None)
    assert 0 < delay < 1e-10
    assert math.isclose(math.log(delay), math.log(5e-324) + 2 * math.log(1e156))


@pytest.mark.parametrize(
    ("backoff", "cap"), [(math.nan, None), (0.5, None), (math.inf, None), (2.0, -1.0)]
)
def test_stored_values_the_checks_refuse_read_as_no_growth_and_no_cap(
    backoff: float, cap: float | None
) -> None:
    """A row edited by hand does not stop the retry being recorded."""
    expected = 20.0 if backoff == 2.0 else 10.0
    assert retry_delay_after(2, 10.0, backoff, cap) == expected


# -- the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "cap", "expected"),
    [
        (1, None, (1.0, None)),
        (2, 300, (2.0, 300.0)),
        (Decimal("1.5"), 0, (1.5, 0.0)),
        (Fraction(5, 2), 86_400, (2.5, 86_400.0)),
        (1e308, 0.001, (1e308, 0.001)),
    ],
)
def test_check_backoff_accepts_factors_from_one_and_caps_from_zero_to_a_day(
    backoff: Any, cap: Any, expected: tuple[float, float | None]
) -> None:
    got = check_backoff(backoff, cap)
    assert got == expected
    assert type(got[0]) is float and (got[1] is None or type(got[1]) is float)


#: Bad ``retry_backoff`` / ``retry_delay_max`` arguments, and the argument each names.
BAD = [
    ({"retry_backoff": 0.99}, "retry_backoff"),
    ({"retry_backoff": 0}, "retry_backoff"),
    ({"retry_backoff": -2}, "retry_backoff"),
    ({"retry_backoff": math.nan}, "retry_backoff"),
    ({"retry_backoff": math.inf}, "retry_backoff"),
    ({"retry_backoff": -math.inf}, "retry_backoff"),
    ({"retry_backoff": Decimal("NaN")}, "retry_backoff"),
    ({"retry_backoff": Decimal("sNaN")}, "retry_backoff"),
    ({"retry_backoff": 10**400}, "retry_backoff"),
    ({"retry_backoff": True}, "retry_backoff"),
    ({"retry_backoff": "2"}, "retry_backoff"),
    ({"retry_backoff": None}, "retry_backoff"),
    ({"retry_delay_max": -1}, "retry_delay_max"),
    ({"retry_delay_max": -0.001}, "retry_delay_max"),
    ({"retry_delay_max": math.nan}, "retry_delay_max"),
    ({"retry_delay_max": math.inf}, "retry_delay_max"),
    ({"retry_delay_max": 86_401}, "retry_delay_max"),
    ({"retry_delay_max": 10**400}, "retry_delay_max"),
    ({"retry_delay_max": True}, "retry_delay_max"),
    ({"retry_delay_max": "300"}, "retry_delay_max"),
    ({"retry_delay_max": timedelta(seconds=30)}, "retry_delay_max"),
]


@pytest.mark.parametrize(("kwargs", "named"), BAD)
def test_check_backoff_refuses_with_the_argument_named(kwargs: dict[str, Any], named: str) -> None:
    args = {"retry_backoff": 2.0, "retry_delay_max": None, **kwargs}
    with pytest.raises(ValueError, match=named):
        check_backoff(args["retry_backoff"], args["retry_delay_max"])


# -- bad input: nothing stored ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kwargs", "named"), BAD)
def test_every_way_to_create_a_step_refuses_a_bad_backoff_writing_nothing(
    kwargs: dict[str, Any], named: str
) -> None:
    run = WorkflowRun.objects.start("tests.backoff.step", {})
    with pytest.raises(ValueError, match=named):
        WorkflowStep.objects.schedule(run.id, "s", FAILS, **kwargs)
    # What schedule_many, schedule_claimed, set_result_claiming_next, start_one_step and the
    # Tasks backend take: the options refuse the value as they are made.
    with pytest.raises(ValueError, match=named):
        StepOptions(**kwargs)
    assert not WorkflowStep.objects.filter(run_id=run.id).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("workflow_name", ["tests.backoff.step", "tests.backoff.parallel"])
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"retry_backoff": 0.5}, "retry_backoff"),
        ({"retry_backoff": "nan"}, "retry_backoff"),  # NaN (see _arguments)
        ({"retry_backoff": "2"}, "retry_backoff"),
        ({"retry_backoff": True}, "retry_backoff"),
        ({"retry_delay_max": -1}, "retry_delay_max"),
        ({"retry_delay_max": 1e308}, "retry_delay_max"),
    ],
)
def test_run_step_and_parallel_refuse_a_bad_backoff_and_the_run_fails_clearly(
    workflow_name: str, kwargs: dict[str, Any], named: str
) -> None:
    run_id = start_workflow(workflow_name, kwargs)
    run = drive(run_id)
    assert run is not None
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["code"] == WORKFLOW_ERROR
    assert named in run.error["message"]
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()


# -- recorded on every path, and applied --------------------------------------------------------


@pytest.fixture
def both_paths(sql_path: str) -> Any:
    """Each path of the SQL switch, with queues without limits (so that on PostgreSQL the
    tuned statements run: the step inserted already claimed, the one-statement claim)."""
    with no_queue_limits():
        yield sql_path


@pytest.mark.django_db(transaction=True)
def test_run_step_records_the_backoff_and_each_retry_waits_its_delay(both_paths: str) -> None:
    run_id = start_workflow("tests.backoff.step", BACKOFF)
    for attempt, delay in ((1, 10), (2, 20), (3, 30)):
        before = db_clock(run_id)
        spy = mock.patch.object(scheduling, "call_function", wraps=workflow_base.call_function)
        with spy as calls:
            if attempt == 1:  # as a worker drives a run: its step inserted already claimed
                RunDriver(run_id, step_lease_ttl=LEASE).drive()
            else:
                drive(run_id, skip_sleeps=False)  # the attempt runs, fails, its retry waits
        after = db_clock(run_id)
        step = WorkflowStep.objects.get(run_id=run_id)
        assert (step.status, step.attempt) == (StepStatus.FAILED, attempt)
        assert (step.retries, step.retry_delay) == (3, 10.0)
        assert (step.retry_backoff, step.retry_delay_max) == (2.0, 30.0)
        assert_due_after(step, before, after, delay)
        if attempt == 1 and both_paths == "tuned" and connection.vendor == "postgresql":
            called = [call.args[1] for call in calls.call_args_list]
            assert "insert_claimed" in called, "the tuned statement did not insert the step"
        make_due(run_id)
    run = drive(run_id, skip_sleeps=False)  # attempt 4 fails: out of attempts
    assert run is not None and run.status == RunStatus.FAILED
    assert run.error["code"] == STEP_FAILED
    assert WorkflowStep.objects.get(run_id=run_id).available_at is None


@pytest.mark.django_db(transaction=True)
def test_the_default_backoff_keeps_the_delay_constant(both_paths: str) -> None:
    run_id = start_workflow("tests.backoff.step", {"retries": 2, "retry_delay": 10})
    for attempt in (1, 2):
        before = db_clock(run_id)
        drive(run_id, skip_sleeps=False)
        after = db_clock(run_id)
        step = WorkflowStep.objects.get(run_id=run_id)
        assert (step.attempt, step.retry_backoff, step.retry_delay_max) == (attempt, 1.0, None)
        assert_due_after(step, before, after, 10)
        make_due(run_id)


@pytest.mark.django_db(transaction=True)
def test_a_pass_reads_the_backoff_back(both_paths: str) -> None:
    run_id = start_workflow("tests.backoff.step", BACKOFF)
    drive(run_id, skip_sleeps=False)
    taken = WorkflowRun.objects.take_pass(run_id, LEASE, "tests.backoff")
    assert taken is not None and taken.lease is not None
    step = taken.state.steps["work"]
    assert (step.retry_delay, step.retry_backoff, step.retry_delay_max) == (10.0, 2.0, 30.0)
    from django_leases.models import Lease

    Lease.objects.release(taken.lease)


@pytest.mark.django_db(transaction=True)
def test_run_parallel_records_the_backoff_on_each_step(both_paths: str) -> None:
    run_id = start_workflow("tests.backoff.parallel", BACKOFF)
    for attempt, delay in ((1, 10), (2, 20)):
        before = db_clock(run_id)
        drive(run_id, skip_sleeps=False)
        after = db_clock(run_id)
        steps = WorkflowStep.objects.filter(run_id=run_id).order_by("step_name")
        assert [s.step_name for s in steps] == ["a", "b"]
        for step in steps:
            assert (step.attempt, step.retry_backoff, step.retry_delay_max) == (attempt, 2.0, 30.0)
            assert_due_after(step, before, after, delay)
        make_due(run_id)


@pytest.mark.django_db(transaction=True)
def test_schedule_claimed_and_start_one_step_record_the_backoff(both_paths: str) -> None:
    run = WorkflowRun.objects.start("tests.backoff.step", {})
    options = StepOptions(retries=2, retry_delay=4, retry_backoff=2.5, retry_delay_max=9)
    scheduled = WorkflowStep.objects.schedule_claimed(
        run.id,
        NextStep("claimed", FAILS, {}, options),
        lease_ttl_seconds=LEASE,
        finish_pass=run.pass_requests,
    )
    assert scheduled.claim is not None
    assert (scheduled.step.retry_backoff, scheduled.step.retry_delay_max) == (2.5, 9.0)
    stored = WorkflowStep.objects.get(pk=scheduled.step.pk)
    assert (stored.retry_delay, stored.retry_backoff, stored.retry_delay_max) == (4.0, 2.5, 9.0)
    for attempt in (1, 2):
        if attempt > 1:
            make_due(run.id)
            claim = WorkflowStep.objects.claim_for_execution(run.id, "claimed", FAILS, LEASE)
            assert claim is not None and claim.attempt == attempt
        before = db_clock(run.id)
        WorkflowStep.objects.set_error(stored.pk, "no", attempt)
        after = db_clock(run.id)
        step = WorkflowStep.objects.get(pk=stored.pk)
        assert_due_after(step, before, after, [4, 9][attempt - 1])  # 4 × 2.5 = 10, capped at 9

    one = WorkflowRun.objects.start_one_step(
        "tests.backoff.step",
        {},
        step_name="work",
        function_name=FAILS,
        options=StepOptions(retries=1, retry_delay=1, retry_backoff=4, retry_delay_max=None),
    )
    step = WorkflowStep.objects.get(run_id=one.id)
    assert (step.retry_delay, step.retry_backoff, step.retry_delay_max) == (1.0, 4.0, None)


@pytest.mark.django_db(transaction=True)
def test_a_row_inserted_without_the_columns_gets_the_constant_delay() -> None:
    """SQL written before backoffs existed (an old function, a script) inserts steps without
    the two columns: the database's defaults keep their delay constant."""
    run = WorkflowRun.objects.start("tests.backoff.step", {})
    table = connection.ops.quote_name(WorkflowStep._meta.db_table)
    run_id = WorkflowRun._meta.pk.get_db_prep_value(run.id, connection)  # type: ignore[union-attr]
    created = connection.ops.adapt_datetimefield_value(run.created_at)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (run_id, step_name, function_name, data, status, attempt, "
            "retries, retry_delay, created_at, updated_at) "
            "VALUES (%s, 'raw', %s, '{}', 'pending', 1, 2, 10, %s, %s)",
            [run_id, FAILS, created, created],
        )
    step = WorkflowStep.objects.get(run_id=run.id, step_name="raw")
    assert (step.retry_backoff, step.retry_delay_max) == (1.0, None)
