"""Races between separate processes, each with its own database connection, on the real
database with real commits: exactly one of eight claiming processes wins a step, and a stale
and a current writer racing 25 times in varying order always leave the current attempt's
result — and only it — in the step and its history.

The same races between threads are part of the shipped conformance suite
(``django_leases.testing.workflows``: C12 and F6, run by ``test_workflow_conformance.py``).
Processes are forked (:func:`tests.helpers.race_in_processes`), so each child starts from this
test's settings and database and opens its own connection.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.workflows.values import Claim
from tests.helpers import lapse_step_lease, race_in_processes

pytestmark = pytest.mark.django_db(transaction=True)

STEP = "charge"
FUNCTION = "charge:card"
LEASE = 60.0
RACES = 25
PROCESSES = 8


def start_run() -> uuid.UUID:
    run = WorkflowRun.objects.start("races", {})
    WorkflowStep.objects.schedule(run.id, STEP, FUNCTION, {}, retries=5)
    return run.id


def claim(run_id: uuid.UUID) -> Claim | None:
    return WorkflowStep.objects.claim_for_execution(run_id, STEP, FUNCTION, LEASE)


def history(run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return [(h.attempt, h.status, h.result, h.error) for h in WorkflowStep.objects.history(run_id)]


@pytest.mark.parametrize("state", ["pending", "lapsed"])
def test_exactly_one_of_eight_processes_claims_a_step(state: str) -> None:
    for round_ in range(3):
        run_id = start_run()
        expected = 1
        if state == "lapsed":
            assert claim(run_id) is not None
            lapse_step_lease(run_id=run_id)
            expected = 2
        outcomes = race_in_processes(*[lambda run_id=run_id: claim(run_id)] * PROCESSES)
        assert [error for _, error in outcomes if error] == [], f"round {round_}"
        winners = [value for value, _ in outcomes if value is not None]
        assert len(winners) == 1, f"round {round_}: {len(winners)} processes won"
        assert winners[0].attempt == expected
        step = WorkflowStep.objects.get(run_id=run_id)
        assert (step.status, step.attempt) == ("running", expected)
        assert [h[:2] for h in history(run_id)] == [(n, "running") for n in range(1, expected + 1)]


def test_stale_and_current_writers_in_separate_processes_only_the_current_lands() -> None:
    for i in range(RACES):
        run_id = start_run()
        stale = claim(run_id)
        assert stale is not None
        lapse_step_lease(run_id=run_id)
        current = claim(run_id)
        assert current is not None and current.attempt == stale.attempt + 1

        def stale_write(stale: Claim = stale, i: int = i) -> str:
            if i % 2:
                return WorkflowStep.objects.set_error(stale.step_id, "stale", stale.attempt).status
            return WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt).status

        def current_write(current: Claim = current) -> str:
            return WorkflowStep.objects.set_result(current.step_id, "fresh", current.attempt).status

        if i % 3:
            (_, stale_error), (written, current_error) = race_in_processes(
                stale_write, current_write
            )
        else:
            (written, current_error), (_, stale_error) = race_in_processes(
                current_write, stale_write
            )
        assert stale_error.startswith("WorkflowStepSupersededError"), f"race {i}: {stale_error}"
        assert (written, current_error) == ("succeeded", ""), f"race {i}"
        step = WorkflowStep.objects.get(run_id=run_id)
        assert (step.status, step.result, step.error, step.attempt) == (
            "succeeded",
            "fresh",
            None,
            current.attempt,
        ), f"race {i}"
        assert history(run_id) == [
            (1, "running", None, None),
            (2, "succeeded", "fresh", None),
        ], f"race {i}"
