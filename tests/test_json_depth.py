"""JSON nested deeper than the database's JSON columns store is refused by the package, with
a ``ValueError`` and nothing written — not left to the database's error.

MariaDB's JSON columns refuse 32 levels of nesting (``CHECK (JSON_VALID(...))``:
``validation.json_depth`` is 31 there, 100 — the package's own limit — elsewhere). A run's input, a
step's data, a child's input and a step's result are all checked against the database they
are stored on; a step result too deep fails its attempt (``STEP_RESULT_NOT_JSON``) instead of
failing every write of it with the database's error.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from django_leases.validation import json_depth
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.values import STEP_RESULT_NOT_JSON
from tests.helpers import drain, json_nested, run_of

pytestmark = pytest.mark.django_db(transaction=True)


def depth() -> int:
    """The deepest nesting this database's JSON columns store."""
    return json_depth(connection)


@step_function("tests.depth-echo")
def echo(data: Any, ctx: Any) -> Any:
    """Returns a value nested as deep as ``data["levels"]`` asks."""
    return json_nested(data["levels"])


@workflow("tests.depth-steps")
def depth_steps(run: Any, input: Any) -> Any:
    return run.step("echo", "tests.depth-echo", {"levels": input["levels"]}, retries=0)


@workflow("tests.depth-data")
def depth_data(run: Any, input: Any) -> Any:
    return run.step("echo", "tests.depth-echo", {"levels": 1, "deep": json_nested(depth() + 1)})


def test_a_run_input_deeper_than_the_database_stores_is_refused_with_nothing_written() -> None:
    deepest = depth()
    before = WorkflowRun.objects.count()
    start_workflow("tests.depth-steps", {"levels": 1, "deep": json_nested(deepest - 1)})
    with pytest.raises(ValueError, match=f"nests deeper than {deepest} levels"):
        start_workflow("tests.depth-steps", {"levels": 1, "deep": json_nested(deepest)})
    assert WorkflowRun.objects.count() == before + 1


def test_step_data_deeper_than_the_database_stores_fails_the_run_not_the_write() -> None:
    deepest = depth()
    run_id = start_workflow("tests.depth-data", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert f"nests deeper than {deepest} levels" in str(run.error)
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()


def test_a_step_result_deeper_than_the_database_stores_fails_its_attempt() -> None:
    deepest = depth()
    stored = start_workflow("tests.depth-steps", {"levels": deepest})
    too_deep = start_workflow("tests.depth-steps", {"levels": deepest + 1})
    drain()
    assert run_of(stored).status == RunStatus.COMPLETED
    assert run_of(stored).output == json_nested(deepest)
    step = WorkflowStep.objects.get(run_id=too_deep, step_name="echo")
    assert step.error is not None and step.error["code"] == STEP_RESULT_NOT_JSON
    assert run_of(too_deep).status == RunStatus.FAILED
