"""A fault in the library's own work ends the unit of work, never the run; an error the
library records is always one the database takes (issue 25, items 2 and 5).

* the pass's read of the run's queue key (a keyed queue's step without a key of its own)
  is the library's statement: a dropped connection there ends the unit, the run goes on;
* an error is recorded on every database: an exception's ``error_fields`` that nest deeper
  than the least a supported database stores (MariaDB: 31 levels) are left out, and a
  step's error still fits inside its run's ``STEP_FAILED`` error — on MariaDB every write of
  such an error was refused (``IntegrityError`` 4025), pass after pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.test import override_settings

from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from django_leases.validation import json_depth
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.worker import Worker
from tests.helpers import json_nested, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


@step_function("tests.faults-name")
def named(data: Any, ctx: Any) -> Any:
    return {"s": ctx.step_name}


@contextmanager
def keyed_queue() -> Iterator[None]:
    """The suite's queues plus ``tests-faults-keyed`` (per-key limits: a keyed queue)."""
    merged = {**(getattr(settings, "DJANGO_LEASES", None) or {})}
    merged["QUEUES"] = {**merged.get("QUEUES", {}), "tests-faults-keyed": {"key_concurrency": 2}}
    with override_settings(DJANGO_LEASES=merged):
        yield


def work_through(run_id: Any, units: int = 20) -> tuple[WorkflowRun, list[str]]:
    """Work until nothing is due (at most ``units``): the run, and the database errors the
    units raised (as the worker's loop takes them)."""
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    errors = []
    for _ in range(units):
        try:
            if not worker.work_once():
                break
        except (DatabaseError, InterfaceError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
    return WorkflowRun.objects.get(pk=run_id), errors


# -- the keyed queue's read of the run's queue key ------------------------------------------------


@workflow("tests.faults-keyed")
def keyed_step(run: Any, input: Any) -> Any:
    return run.step("k", "tests.faults-name", {}, retries=2, queue="tests-faults-keyed")


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_a_dropped_connection_reading_the_runs_queue_key_does_not_fail_the_run(
    tuned: bool,
) -> None:
    """A step of a keyed queue without a key of its own counts under the run's
    ``queue_key``, which the pass reads inside the workflow function: when the connection
    drops there, the unit of work ends and the run goes on (not ``WORKFLOW_ERROR``)."""
    failed: list[str] = []

    def drop_queue_key_read(execute: Any, sql: str, params: Any, many: bool, ctx: Any) -> Any:
        read = f"SELECT {connection.ops.quote_name(WorkflowRun._meta.db_table)}."
        if not failed and sql.startswith(read + connection.ops.quote_name("queue_key")):
            failed.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, ctx)

    with keyed_queue(), tuned_sql(tuned):
        run_id = start_workflow("tests.faults-keyed", {}, queue_key="tenant-1")
        with connection.execute_wrapper(drop_queue_key_read):
            run, errors = work_through(run_id, units=3)
        assert failed, "the queue key was never read: the test proves nothing"
        assert run.status != RunStatus.FAILED, run.error
        run, errors = work_through(run_id)
        assert (run.status, run.output, errors) == (RunStatus.COMPLETED, {"s": "k"}, [])


# -- errors nested deeper than a database stores ---------------------------------------------------


class DeepError(Exception):
    """An exception whose ``error_fields`` value nests ``levels`` deep."""

    def __init__(self, levels: int) -> None:
        super().__init__("deep")
        self.error_fields = {"detail": json_nested(levels)}


@step_function("tests.faults-deep-error")
def deep_error(data: Any, ctx: Any) -> Any:
    raise DeepError(data["levels"])


@workflow("tests.faults-raises-deep")
def raises_deep(run: Any, input: Any) -> Any:
    raise DeepError(input["levels"])


@workflow("tests.faults-step-raises-deep")
def step_raises_deep(run: Any, input: Any) -> Any:
    return run.step("s", "tests.faults-deep-error", {"levels": input["levels"]}, retries=0)


@pytest.mark.parametrize("less", [0, 1, 2])
def test_a_workflow_error_with_a_deep_field_is_recorded(less: int) -> None:
    run_id = start_workflow("tests.faults-raises-deep", {"levels": json_depth(connection) - less})
    run, errors = work_through(run_id)
    assert (run.status, errors) == (RunStatus.FAILED, [])
    assert run.error["type"] == "DeepError"


@pytest.mark.parametrize("less", [-1, 0, 1, 2])
def test_a_step_error_with_a_deep_field_is_recorded_and_fits_in_the_runs_error(
    less: int,
) -> None:
    run_id = start_workflow(
        "tests.faults-step-raises-deep", {"levels": json_depth(connection) - less}
    )
    run, errors = work_through(run_id)
    assert (run.status, errors) == (RunStatus.FAILED, [])
    step = WorkflowStep.objects.get(run_id=run_id, step_name="s")
    assert step.status == "failed" and step.error["type"] == "DeepError"
    assert run.error["step_error"]["type"] == "DeepError"


def test_an_error_field_that_fits_everywhere_is_kept() -> None:
    run_id = start_workflow("tests.faults-step-raises-deep", {"levels": 29})
    run, _ = work_through(run_id)
    assert run.error["step_error"]["detail"] == json_nested(29)
