"""Results once: a step's result is stored on the step alone (its attempt rows hold none,
``WorkflowStepAttempt.result`` reads it from the step), and what a pass reads carries each
result as JSON text, decoded only when read (``RecordedJSONField``). On PostgreSQL each test
runs on both paths (``sql_path``: tuned, portable)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from django_leases.models import recorded as recorded_module
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from tests.helpers import drain, run_of

pytestmark = pytest.mark.django_db(transaction=True)

#: Results replay must give back exactly: falsy ones, nesting, unicode, a large one.
VALUES: list[Any] = [
    None,
    0,
    0.0,
    False,
    "",
    [],
    {},
    1.5,
    -7,
    "Grüße ✓",
    [None, [0, [False, {"a": []}]]],
    {"b": {"c": [1, 2.5, "x", None]}, "a": True, "long key": {"": 0}},
    {"blob": "x" * 150_000, "rows": [{"i": i, "v": str(i) * 3} for i in range(500)]},
    # Keys that are not strings, a tuple, numbers jsonb prints otherwise: the result handed
    # back in memory is what a replay reads.
    {1: ("a", -0.0), None: 1e16, "é": {"bb": 1, "a": 2.5e-7}},
]

_seen: list[list[Any]] = []
_seen_lock = threading.Lock()
_failures: dict[str, int] = {}


@step_function("tests.results-once.value")
def value_step(data: Any, ctx: Any) -> Any:
    return VALUES[int(data)]


@step_function("tests.results-once.flaky")
def flaky_step(data: Any, ctx: Any) -> Any:
    """Fails ``data["fail"]`` times (per key), then returns ``data["value"]``."""
    key = str(data["key"])
    with _seen_lock:
        _failures[key] = _failures.get(key, 0) + 1
        failed = _failures[key]
    if failed <= int(data["fail"]):
        raise RuntimeError(f"attempt {failed} fails")
    return data["value"]


@workflow("tests.results-once.values")
def values_workflow(run: Any, input: Any) -> Any:
    """Every value of ``VALUES`` as a step's result, then a wait: the pass after the event
    replays every result from the start."""
    got = [run.step(f"v{i}", "tests.results-once.value", i) for i in range(len(VALUES))]
    with _seen_lock:
        _seen.append(got)
    run.wait_for_event("go")
    return len(got)


@workflow("tests.results-once.flaky")
def flaky_workflow(run: Any, input: Any) -> Any:
    return run.step("flaky", "tests.results-once.flaky", input, retries=3)


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    _seen.clear()
    _failures.clear()
    yield
    _seen.clear()
    _failures.clear()


def _attempt_results_stored() -> list[Any]:
    """The attempt table's ``result`` column as stored (the model has no such field: the
    column stays one release for the previous release's workers)."""
    table = connection.ops.quote_name(WorkflowStepAttempt._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT result FROM {table}")
        return [row[0] for row in cursor.fetchall()]


def _typed(value: Any) -> Any:
    """``value`` with each number's and bool's type kept apart (``0`` ≠ ``0.0`` ≠ ``False``)
    for an exact comparison."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


def test_a_result_is_stored_on_the_step_and_not_on_its_attempt(sql_path: str) -> None:
    run_id = start_workflow("tests.results-once.values", {})
    drain()
    steps = WorkflowStep.objects.filter(run_id=run_id)
    assert steps.count() == len(VALUES)
    assert all(step.status == "succeeded" for step in steps)
    assert _attempt_results_stored() == [None] * len(VALUES)
    # The step keeps the result; the history reads it from there.
    by_name = {entry.step.step_name: entry for entry in WorkflowStep.objects.history(run_id)}
    for index, value in enumerate(VALUES):
        assert by_name[f"v{index}"].status == "succeeded"
        stored = json.loads(json.dumps(WorkflowStep.objects.stored_json(value)))
        assert _typed(by_name[f"v{index}"].result) == _typed(stored)


def test_replay_returns_every_recorded_result_exactly(sql_path: str) -> None:
    run_id = start_workflow("tests.results-once.values", {})
    drain()
    assert run_of(run_id).status == "running"  # waiting for "go"
    send_event(run_id, "go")
    drain()
    assert run_of(run_id).status == "completed"
    # The first pass saw the results as it ran them, the second replayed them all.
    assert len(_seen) == 2
    expected = [json.loads(json.dumps(WorkflowStep.objects.stored_json(value))) for value in VALUES]
    assert [_typed(v) for v in _seen[1]] == [_typed(v) for v in expected]
    assert [_typed(v) for v in _seen[1]] == [_typed(v) for v in _seen[0]]


def test_the_history_shows_each_attempt_s_outcome(sql_path: str) -> None:
    value = {"answer": [42, None, False], "text": "y" * 5_000}
    run_id = start_workflow(
        "tests.results-once.flaky", {"key": sql_path, "fail": 2, "value": value}
    )
    drain()
    assert run_of(run_id).status == "completed"
    history = [
        (entry.attempt, entry.status, entry.result, entry.error is not None)
        for entry in WorkflowStep.objects.history(run_id)
    ]
    assert history == [
        (1, "failed", None, True),
        (2, "failed", None, True),
        (3, "succeeded", value, False),
    ]
    errors = [entry.error["message"] for entry in WorkflowStep.objects.history(run_id)[:2]]
    assert [m.endswith(f"attempt {n} fails") for n, m in enumerate(errors, 1)] == [True, True]
    assert _attempt_results_stored() == [None, None, None]


def test_the_admin_s_attempt_history_shows_the_final_result() -> None:
    from django_leases.admin.workflows import WorkflowRunAdmin

    value = {"marker": "the-final-result-of-attempt-3"}
    run_id = start_workflow("tests.results-once.flaky", {"key": "admin", "fail": 2, "value": value})
    drain()
    from django.contrib import admin

    page = WorkflowRunAdmin(WorkflowRun, admin.site).history(run_of(run_id))
    assert page.count("dl-attempt-failed") == 2
    assert page.count("dl-attempt-succeeded") == 1
    assert "the-final-result-of-attempt-3" in page
    assert "attempt 1 fails" in page and "attempt 2 fails" in page


def test_a_pass_state_decodes_a_result_only_when_it_is_read(sql_path: str) -> None:
    run_id = start_workflow("tests.results-once.values", {})
    drain()
    claim = WorkflowRun.objects.take_pass(run_id, 30.0, "tests.results-once")
    state = claim.state if claim is not None else WorkflowRun.objects.pass_state(run_id)
    assert state is not None
    for index, value in enumerate(VALUES):
        step = state.steps[f"v{index}"]
        assert "result" not in step.__dict__, "decoded before it was read"
        assert _typed(step.result) == _typed(WorkflowStep.objects.stored_json(value))
        assert "result" in step.__dict__  # decoded once, then kept


def test_a_pass_decodes_only_the_results_its_workflow_reads(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pass runs every step inline and keeps its frame: it reads no recorded
    result, so it decodes none. The pass after the event replays every step from the start:
    one decode per recorded result, each once."""
    decoded: list[str] = []
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(recorded_module, "json", _Json(counting))
    run_id = start_workflow("tests.results-once.values", {})
    drain()
    assert len(_seen) == 1
    assert decoded == []
    send_event(run_id, "go")
    drain()
    assert run_of(run_id).status == "completed"
    assert len(decoded) == len(VALUES)


class _Json:
    """A stand-in for the ``json`` module of :mod:`django_leases.models.recorded` whose
    ``loads`` is counted."""

    def __init__(self, loads: Any) -> None:
        self.loads = loads
