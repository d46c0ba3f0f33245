"""A fan-out's first pass schedules its steps an insert statement per
:data:`~django_leases.models.scheduling.FAN_OUT_BATCH` steps (fewer on SQLite, within its
bound parameters), as docs/howto/waits.md says: 1,000 steps are one pass and two statements,
never one per step."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.models import WorkflowStep
from django_leases.models.scheduling import FAN_OUT_BATCH
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass

pytestmark = pytest.mark.django_db(transaction=True)


@step_function("tests.fan-out-statements.ok")
def ok(data: Any, ctx: Any) -> Any:
    return data


@workflow("tests.fan-out-statements.fan-out")
def fan_out(run: Any, input: Any) -> Any:
    calls = [(f"b{i}", "tests.fan-out-statements.ok", i) for i in range(input["n"])]
    return run.parallel(calls, retries=0)


def test_a_fan_out_of_1000_steps_is_an_insert_per_batch() -> None:
    run_id = start_workflow("tests.fan-out-statements.fan-out", {"n": 1000})
    table = WorkflowStep._meta.db_table
    with CaptureQueriesContext(connection) as captured:
        assert run_pass(run_id) == "waiting"
    inserts = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith("INSERT") and table in q["sql"]
    ]
    if connection.vendor == "sqlite":  # its bound-parameter limit makes smaller batches
        assert len(inserts) <= 1000 / 20, len(inserts)
    else:
        assert len(inserts) == math.ceil(1000 / FAN_OUT_BATCH), len(inserts)
    assert WorkflowStep.objects.filter(run_id=run_id).count() == 1000
