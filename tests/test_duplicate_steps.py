"""``drive(..., duplicate_steps=True)``: every step function runs twice, as a superseded
attempt's would, and the steps whose second run changed the database are named."""

from __future__ import annotations

import pytest

from django_leases.exceptions import StepNotIdempotentError
from django_leases.testing import drive
from django_leases.workflows import start_workflow
from tests.workapp.models import LedgerEntry

pytestmark = pytest.mark.django_db


def test_a_non_idempotent_step_is_named_and_an_idempotent_one_is_not() -> None:
    run_id = start_workflow("tests.dup.steps", ["tests.dup.upsert", "tests.dup.insert"])
    with pytest.raises(StepNotIdempotentError) as found:
        drive(run_id, duplicate_steps=True)
    (step,) = found.value.steps
    assert (step.run_id, step.step_name, step.function_name) == (run_id, "s1", "tests.dup.insert")
    assert step.changes == {"workapp.LedgerEntry": "1 rows added, 0 removed"}
    assert "'s1' (tests.dup.insert)" in str(found.value)
    # The drive itself went to the end: the run completed, each step ran twice.
    assert LedgerEntry.objects.filter(run_id=run_id, step="s1").count() == 2
    assert LedgerEntry.objects.filter(run_id=run_id, step="s0").count() == 1


def test_idempotent_and_transactional_steps_pass() -> None:
    run_id = start_workflow("tests.dup.steps", ["tests.dup.upsert", "tests.tx.append"])
    run = drive(run_id, duplicate_steps=True)
    assert run is not None and run.status == "completed"
    # The transactional step's first run was rolled back, as a superseded attempt's is.
    assert LedgerEntry.objects.filter(run_id=run_id, step="s1").count() == 1


def test_without_the_flag_nothing_runs_twice() -> None:
    run_id = start_workflow("tests.dup.steps", ["tests.dup.insert"])
    run = drive(run_id)
    assert run is not None and run.status == "completed"
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 1
