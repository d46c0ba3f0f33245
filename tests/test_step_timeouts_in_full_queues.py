"""A step timeout in a queue its own attempt keeps full.

An attempt still running after its ``timeout`` "is failed with code ``STEP_TIMED_OUT`` by the
next worker that looks for due work" (docs/howto/workflows.md, "Step timeouts"). In a queue
whose only slot, rate or key slot that attempt holds (its worker still renewing its lease),
a claim of that queue, of every queue, or of that queue and another must still time it out:
timing an attempt out needs no room in the queue.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_leases import clock
from django_leases.models import WorkflowStep, WorkflowStepAttempt
from django_leases.workflows import start_workflow, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.values import STEP_TIMED_OUT
from tests.helpers import limited_queues

pytestmark = pytest.mark.django_db(transaction=True)


@workflow("tests.full-queue-timeout")
def timed(run: Any, input: Any) -> Any:
    return run.step("slow", "tests.full-queue-slow", {}, retries=2, timeout=30)


@pytest.mark.parametrize(
    "limits",
    [
        {"concurrency": 1},
        {"rate": "1/h"},
        {"concurrency": 1, "rate": "1/h"},
        {"key_concurrency": 1},
        {"key_rate": "1/h"},
    ],
    ids=["concurrency", "rate", "both", "key-concurrency", "key-rate"],
)
@pytest.mark.parametrize("queues", [["q"], None, ["q", "default"]], ids=["q", "all", "q+default"])
def test_a_timed_out_attempt_holding_the_queues_only_slot_is_timed_out(
    sql_path: str, limits: dict[str, Any], queues: list[str] | None
) -> None:
    with limited_queues({"q": limits}, {"tests.full-queue-slow": "q"}):
        run_id = start_workflow("tests.full-queue-timeout")
        run_pass(run_id)
        claim = WorkflowStep.objects.claim_due(60, queues=["q"])
        assert claim is not None and claim.attempt == 1
        # The attempt runs past its timeout (its worker still renews its lease).
        WorkflowStep.objects.filter(pk=claim.step_id).update(deadline_at=clock.db_now_plus(-1))
        WorkflowStep.objects.claim_due(60, queues=queues)
    first = WorkflowStepAttempt.objects.get(step_id=claim.step_id, attempt=1)
    assert first.status == "failed", "the attempt past its timeout was not timed out"
    assert (first.error or {}).get("code") == STEP_TIMED_OUT, first.error
