"""Outcomes the workflow engine must survive: step functions and workflows that raise
``SystemExit`` and the like, a worker thread that dies, fenced writes whose connection drops
(or whose acknowledgement is lost), results, errors and input that cannot be stored as they
are, and out-of-range ``retries`` / ``retry_delay``."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.test import Client
from django.urls import reverse

from django_leases import validation
from django_leases.admin.workflows import _json
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.workflow import WorkflowStepQuerySet
from django_leases.validation import check_json, error_json
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import execute_step, start_workflow
from django_leases.workflows.values import STEP_FAILED, STEP_RESULT_NOT_JSON, WORKFLOW_ERROR
from django_leases.workflows.worker import Worker
from tests.helpers import drain, run_of, start_thread, terminate_other_backends

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0


# -- workflows and step functions used here -------------------------------------------------------


class _Custom(BaseException):
    """A ``BaseException`` that is neither ``Exception`` nor ``SystemExit``."""


_RAISES: dict[str, Callable[[], BaseException]] = {
    "SystemExit": lambda: SystemExit(3),
    "GeneratorExit": lambda: GeneratorExit("closed"),
    "_Custom": lambda: _Custom("custom"),
}


@step_function("tests.outcomes.raises-base")
def raises_base(data: dict[str, Any], ctx: Any) -> Any:
    raise _RAISES[data["kind"]]()


@workflow("tests.outcomes.step-raises-base")
def step_raises_base(run: Any, input: dict[str, Any]) -> Any:
    return run.step("s", "tests.outcomes.raises-base", {"kind": input["kind"]}, retries=1)


@workflow("tests.outcomes.workflow-exits")
def workflow_exits(run: Any, input: Any) -> Any:
    raise SystemExit(4)


@step_function("tests.outcomes.returns")
def returns(data: dict[str, Any], ctx: Any) -> Any:
    return data["value"]


@step_function("tests.outcomes.returns-surrogate")
def returns_surrogate(data: Any, ctx: Any) -> Any:
    return {"text": "before \ud800 after"}


@workflow("tests.outcomes.step-returns-surrogate")
def step_returns_surrogate(run: Any, input: Any) -> Any:
    return run.step("s", "tests.outcomes.returns-surrogate", {}, retries=1)


@step_function("tests.outcomes.raises-nul")
def raises_nul(data: Any, ctx: Any) -> Any:
    raise ValueError("bad\x00byte and \udc80 surrogate")


@workflow("tests.outcomes.step-raises-nul")
def step_raises_nul(run: Any, input: Any) -> Any:
    return run.step("s", "tests.outcomes.raises-nul", {}, retries=1)


@workflow("tests.outcomes.output-surrogate")
def output_surrogate(run: Any, input: Any) -> Any:
    return ["fine", "\ud800"]


@workflow("tests.outcomes.raises-nul")
def workflow_raises_nul(run: Any, input: Any) -> Any:
    raise ValueError("bad\x00byte")


@workflow("tests.outcomes.step-args")
def step_args(run: Any, input: dict[str, Any]) -> Any:
    kwargs = dict(input)
    if isinstance(kwargs.get("retry_delay"), str):
        kwargs["retry_delay"] = float(kwargs["retry_delay"])
    name = "s\ud800" if kwargs.pop("bad_name", False) else "s"
    return run.step(name, "tests.outcomes.returns", {"value": 1}, **kwargs)


def history(run_id: uuid.UUID) -> list[tuple[int, str]]:
    return [(h.attempt, h.status) for h in WorkflowStep.objects.history(run_id)]


def claim_step(value: Any = None, *, ttl: float = LEASE) -> tuple[uuid.UUID, Any]:
    run = WorkflowRun.objects.start("tests.outcomes.step-args", {})
    WorkflowStep.objects.schedule(run.id, "s", "tests.outcomes.returns", {"value": value})
    claim = WorkflowStep.objects.claim_for_execution(run.id, "s", "tests.outcomes.returns", ttl)
    assert claim is not None
    return run.id, claim


# -- 1. BaseException from user code ---------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(_RAISES))
def test_a_step_raising_a_base_exception_fails_its_attempt_and_retries_apply(kind: str) -> None:
    run_id = start_workflow("tests.outcomes.step-raises-base", {"kind": kind})
    code = Worker(concurrency=2, poll_interval=0.05, step_lease_ttl=LEASE).run(
        once=True, handle_signals=False
    )
    assert code == 0
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["code"] == STEP_FAILED
    assert run.error["step_error"]["type"] == kind
    assert history(run_id) == [(1, "failed"), (2, "failed")]


def test_a_workflow_raising_system_exit_fails_the_run() -> None:
    run_id = start_workflow("tests.outcomes.workflow-exits", {})
    code = Worker(poll_interval=0.05).run(once=True, handle_signals=False)
    assert code == 0
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert (run.error["code"], run.error["type"]) == (WORKFLOW_ERROR, "SystemExit")


def test_a_worker_thread_that_dies_makes_the_worker_exit_non_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: Worker, seen: int) -> bool:
        raise RuntimeError("bookkeeping broke")

    monkeypatch.setattr(Worker, "_is_drained", broken)
    assert Worker(concurrency=2, poll_interval=0.05).run(once=True, handle_signals=False) != 0
    with pytest.raises(CommandError, match="died") as raised:
        call_command("run_workflow_worker", "--once", "--concurrency", "2")
    assert raised.value.returncode != 0


# -- 2. fenced writes that lose their connection ---------------------------------------------------


def test_repeating_an_outcome_the_attempt_already_recorded_is_not_refused() -> None:
    """A write that committed but whose acknowledgement was lost is retried: the retry must
    report the outcome, not "superseded"; a different outcome is still refused."""
    _, claim = claim_step()
    store = WorkflowStep.objects
    assert store.set_result(claim.step_id, {"n": [1, 2.5]}, claim.attempt).status == "succeeded"
    assert store.set_result(claim.step_id, {"n": (1, 2.5)}, claim.attempt).status == "succeeded"
    with pytest.raises(WorkflowStepSupersededError):
        store.set_result(claim.step_id, {"n": "other"}, claim.attempt)
    with pytest.raises(WorkflowStepSupersededError):
        store.set_error(claim.step_id, ValueError("late"), claim.attempt)

    run_id, claim = claim_step()
    error = ValueError("nope")
    assert store.set_error(claim.step_id, error, claim.attempt).status == "failed"
    assert store.set_error(claim.step_id, error, claim.attempt).status == "failed"
    # Even after the next attempt took the step over, attempt 1's own outcome stands.
    second = store.claim_for_execution(run_id, "s", "tests.outcomes.returns", LEASE)
    assert second is not None and second.attempt == 2
    assert store.set_error(claim.step_id, error, claim.attempt).status == "failed"
    with pytest.raises(WorkflowStepSupersededError):
        store.set_result(claim.step_id, "x", claim.attempt)
    # A superseded attempt's retry is still refused.
    third_run, first = claim_step()
    WorkflowStep.objects.filter(pk=first.step_id).update(lease_expires_at=None)
    taken = store.claim_for_execution(third_run, "s", "tests.outcomes.returns", LEASE)
    assert taken is not None and taken.attempt == 2
    with pytest.raises(WorkflowStepSupersededError):
        store.set_result(first.step_id, None, first.attempt)


@pytest.mark.parametrize("lands", [True, False], ids=["ack-lost", "not-sent"])
def test_execute_step_reconnects_and_retries_a_write_that_lost_its_connection(
    monkeypatch: pytest.MonkeyPatch, lands: bool
) -> None:
    run_id, claim = claim_step({"built": True})
    real = WorkflowStepQuerySet.set_result
    calls: list[int] = []

    def flaky(
        self: WorkflowStepQuerySet, step_id: int, result: Any, attempt: int, **options: Any
    ) -> str:
        calls.append(attempt)
        if len(calls) == 1:
            if lands:
                real(self, step_id, result, attempt, **options)
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, step_id, result, attempt, **options)

    monkeypatch.setattr(WorkflowStepQuerySet, "set_result", flaky)
    assert execute_step(claim) == "succeeded"
    assert calls == [1, 1]
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert (step.status, step.attempt, step.result) == ("succeeded", 1, {"built": True})
    assert history(run_id) == [(1, "succeeded")]
    assert run_of(run_id).pass_due_at is not None, "the run was not asked for its next pass"


def test_a_write_that_keeps_failing_gives_up_at_the_step_lease_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The retries run until the step lease's local deadline: a 3 s lease leaves room for
    # several, however slowly the machine gets to the first one.
    run_id, claim = claim_step("x", ttl=3.0)
    calls: list[int] = []

    def down(
        self: WorkflowStepQuerySet, step_id: int, result: Any, attempt: int, **options: Any
    ) -> str:
        calls.append(attempt)
        raise OperationalError("database unreachable")

    monkeypatch.setattr(WorkflowStepQuerySet, "set_result", down)
    with pytest.raises(OperationalError):
        execute_step(claim)
    assert len(calls) >= 2
    assert history(run_id) == [(1, "running")]


_entered = threading.Event()
_release = threading.Event()


@step_function("tests.outcomes.waits")
def waits(data: Any, ctx: Any) -> str:
    _entered.set()
    assert _release.wait(60), "never released"
    return f"attempt {ctx.attempt}"


@workflow("tests.outcomes.waits")
def waiting(run: Any, input: Any) -> Any:
    return run.step("wait", "tests.outcomes.waits", {}, retries=3)


@pytest.mark.postgres_only
def test_terminating_the_workers_connections_during_a_step_keeps_its_result() -> None:
    _entered.clear()
    _release.clear()
    run_id = start_workflow("tests.outcomes.waits", {})
    worker = Worker(concurrency=1, poll_interval=0.1, step_lease_ttl=30)
    codes: list[int] = []
    runner = start_thread(lambda: codes.append(worker.run(once=True, handle_signals=False)))
    try:
        assert _entered.wait(60), "the step never started"
        # The worker thread's (idle) connection and the renewal's, as a failover would.
        assert terminate_other_backends() >= 1
        _release.set()
        runner.join(120)
    finally:
        _release.set()
        worker.stop()
        runner.join(60)
    assert codes == [0]
    run = run_of(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == "attempt 1", "the finished result was thrown away"
    assert history(run_id) == [(1, "succeeded")]


# -- 3. values that cannot be stored ---------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _cycle() -> Any:
    value: list[Any] = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("\ud800", "surrogate"),
        ({"a": ["ok", "x\udfff"]}, "surrogate"),
        ({"\ud800": 1}, "surrogate"),
        ("a\x00b", "NUL"),
        ({"k\x00": 1}, "NUL"),
        (float("nan"), "nan"),
        ([float("inf")], "inf"),
        (_nested(3000), "deeper"),
        (_cycle(), "deeper"),
        ({1, 2}, "set"),
        ({("a",): 1}, "key"),
        (object(), "object"),
        ({1: "a", "1": "b"}, "both written as"),
        ({None: "a", "null": "b"}, "both written as"),
        ({"x": {True: 1, "true": 2}}, "both written as"),
        ({1.5: 1, "1.5": 2}, "both written as"),
    ],
)
def test_check_json_refuses_what_some_backend_cannot_store(value: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as raised:
        check_json(value, "Thing")
    check_json(str(raised.value), "the message")  # the refusal itself is storable


@pytest.mark.parametrize("given", [{1: "a", "1": "b"}, {None: "a", "null": "b"}])
def test_start_workflow_refuses_input_whose_keys_collide_as_json(given: dict[Any, str]) -> None:
    """Keys that ``json.dumps`` writes alike would keep one value and drop the other."""
    with pytest.raises(ValueError, match="both written as"):
        start_workflow("tests.outcomes.step-args", given)
    assert not WorkflowRun.objects.exists()


@pytest.mark.parametrize(
    "value", [None, True, 0, -(10**30), 1.5, "é😀", {"a": [1, {"b": None}]}, _nested(90)]
)
def test_check_json_accepts_storable_json(value: Any) -> None:
    assert check_json(value, "Thing") is value


#: Values the text-only check and the walk must judge alike (each side of every rule).
QUICK_CASES: list[Any] = [
    {"rows": [{"i": i, "v": "x" * 20} for i in range(300)]},
    'quote " and backslash \\ and \\" and brackets [[[{{{',
    {"k[": ["]", "{", '\\"[[', [[["deep"]]]]},
    "text that says \\u0000 but holds no NUL",
    "a\x00b",
    "\ud800",
    "é😀 and ✓",
    {"\udfff": 1},
    {1: "a", 2.5: "b", False: "d"},
    {1: "a", "1": "b"},
    {None: 1, 2: 3},
    (1, [2, (3,)]),
    float("nan"),
    pytest.param(10**5000, id="an-int-too-long-to-write"),
    {1, 2},
    _cycle(),
]


@pytest.mark.parametrize("depth", [2, 5, 31, 100])
@pytest.mark.parametrize("value", QUICK_CASES + [_nested(n) for n in (1, 4, 5, 6, 30, 31, 99, 100)])
def test_the_text_check_never_accepts_what_the_walk_refuses(value: Any, depth: int) -> None:
    """:func:`check_json` reads the written text first and walks the value only when the
    text does not settle it: whatever the text accepts, the walk accepts too."""
    quick = validation._quick_json_text(value, depth)
    if quick is not None:
        assert validation._json_problem(value, "$", 0, depth) is None
        assert quick == json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


@pytest.mark.parametrize(
    "value", [*QUICK_CASES[:3], "é😀 and ✓", QUICK_CASES[8], QUICK_CASES[11], _nested(99)]
)
def test_storable_json_is_settled_by_its_text(value: Any) -> None:
    """The quick path is taken (the walk, a Python call per value, is not)."""
    assert validation._quick_json_text(value, 100) is not None


def test_the_nesting_read_from_the_text_counts_brackets_outside_strings_only() -> None:
    assert validation._nesting(json.dumps({"a": ["[[[", {"b": '\\"{{'}]})) == 3
    assert validation._nesting(json.dumps(_nested(40), separators=(",", ":"))) == 40
    assert validation._nesting(json.dumps("[[[")) == 0


def test_error_json_replaces_nul_and_lone_surrogates() -> None:
    out = error_json(ValueError("a\x00b\ud800c"))
    assert out == {"type": "ValueError", "message": "a\ufffdb\ufffdc"}
    check_json(out, "error")
    mapped = error_json({"message": "m\x00", "detail": "\udc80", "ok": 1})
    check_json(mapped, "error")
    assert mapped["message"] == "m\ufffd" and mapped["ok"] == 1
    assert error_json("x\x00") == {"message": "x\ufffd"}


def test_a_step_result_that_cannot_be_stored_fails_the_attempt_and_retries_apply() -> None:
    run_id = start_workflow("tests.outcomes.step-returns-surrogate", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["code"] == STEP_FAILED
    assert run.error["step_error"]["code"] == STEP_RESULT_NOT_JSON
    assert "surrogate" in run.error["step_error"]["message"]
    assert history(run_id) == [(1, "failed"), (2, "failed")]


def test_a_step_error_with_nul_and_surrogates_is_stored_cleaned() -> None:
    run_id = start_workflow("tests.outcomes.step-raises-nul", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["code"] == STEP_FAILED
    assert run.error["step_error"]["message"] == "bad\ufffdbyte and \ufffd surrogate"
    assert history(run_id) == [(1, "failed"), (2, "failed")]


def test_a_workflow_output_that_cannot_be_stored_fails_the_run_clearly() -> None:
    run_id = start_workflow("tests.outcomes.output-surrogate", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert run.output is None
    assert "Workflow output" in run.error["message"] and "surrogate" in run.error["message"]


def test_a_workflow_error_with_a_nul_character_is_stored_cleaned() -> None:
    run_id = start_workflow("tests.outcomes.raises-nul", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert (run.error["code"], run.error["message"]) == (WORKFLOW_ERROR, "bad\ufffdbyte")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": "\\ud800"}', "surrogate"),
        ('{"a\\u0000": 1}', "NUL"),
        ("[" * 3000 + "]" * 3000, "deep"),
        ("[" * 150 + "]" * 150, "deeper"),
    ],
)
def test_start_workflow_command_refuses_input_that_cannot_be_stored(
    text: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("start_workflow", "build-preview", "--input", text, stdout=StringIO())
    assert not WorkflowRun.objects.exists()


def test_the_admin_renders_any_stored_json_as_utf8() -> None:
    for value in ("\ud800", {"k": ["\udfff", "\x00"]}, {"\ud800": 1}):
        _json(value).encode("utf-8")


def test_the_run_page_shows_a_stored_lone_surrogate(vendor: str) -> None:
    if vendor != "sqlite":
        pytest.skip(
            "only SQLite can hold a lone surrogate (PostgreSQL and MariaDB's JSON_VALID "
            "refuse it on write)"
        )
    run = WorkflowRun.objects.create(workflow="tests.outcomes.waits", input={"a": "\ud800"})
    WorkflowRun.objects.filter(pk=run.pk).update(output=["\udc80"], error={"message": "\ud800"})
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.test", "pw"))
    page = client.get(reverse("admin:django_leases_workflowrun_change", args=[run.pk]))
    assert page.status_code == 200
    assert b"\\ud800" in page.content


# -- 4. retries and retry_delay ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retries": 2**31}, "retries"),
        ({"retries": 1001}, "retries"),
        ({"retries": True}, "retries"),
        ({"retries": 1.0}, "retries"),
        ({"retry_delay": 1e308}, "retry_delay"),
        ({"retry_delay": "inf"}, "retry_delay"),
        ({"retry_delay": "nan"}, "retry_delay"),
        ({"retry_delay": 10**400}, "retry_delay"),
        ({"retry_delay": 86401}, "retry_delay"),
        ({"retry_delay": -1}, "retry_delay"),
        ({"bad_name": True}, "surrogate"),
    ],
)
def test_run_step_refuses_out_of_range_retries_and_the_run_fails_clearly(
    kwargs: dict[str, Any], message: str
) -> None:
    run_id = start_workflow("tests.outcomes.step-args", kwargs)
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED, run.error
    assert run.error["code"] == WORKFLOW_ERROR
    assert message in run.error["message"]
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()


def test_the_largest_retries_and_retry_delay_are_accepted() -> None:
    run_id = start_workflow("tests.outcomes.step-args", {"retries": 1000, "retry_delay": 86400})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    step = WorkflowStep.objects.get(run_id=run_id)
    assert (step.retries, step.retry_delay, step.status) == (1000, 86400.0, StepStatus.SUCCEEDED)


def test_schedule_refuses_out_of_range_retries_with_nothing_written() -> None:
    run = WorkflowRun.objects.start("tests.outcomes.step-args", {})
    with pytest.raises(ValueError, match="retry_delay"):
        WorkflowStep.objects.schedule(run.id, "s", "tests.outcomes.returns", retry_delay=1e308)
    with pytest.raises(ValueError, match="retries"):
        WorkflowStep.objects.schedule(run.id, "s", "tests.outcomes.returns", retries=2**31)
    assert not WorkflowStep.objects.exists()
