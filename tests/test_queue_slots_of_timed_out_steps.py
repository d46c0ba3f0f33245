"""A step whose attempt ran past its ``timeout`` is failed ``STEP_TIMED_OUT`` by the next worker
that looks for due work (docs/howto/workflows.md, *Step timeouts*) — also when its queue is at
its concurrency (or its key at its ``key_concurrency``): the timed-out attempt must not keep the
queue's slot, and the step waiting behind it must be claimable (docs/howto/queues.md)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_leases.clock import db_now_plus
from django_leases.models import WorkflowStep
from django_leases.workflows import start_workflow, workflow
from tests.helpers import limited_queues, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES: dict[str, dict[str, Any]] = {
    "to-one": {"concurrency": 1},
    "to-keyed": {"key_concurrency": 1},
    "to-free": {},
}
FUNCTIONS = {"tests.to.one": "to-one", "tests.to.keyed": "to-keyed", "tests.to.free": "to-free"}


@workflow("tests.to.idle")
def _idle(run: Any, input: Any) -> Any:
    return None


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    with limited_queues(QUEUES, FUNCTIONS):
        yield


def _steps(function: str, names: list[str], key: str | None = None) -> uuid.UUID:
    run_id = start_workflow("tests.to.idle", {}, queue_key=key)
    for name in names:
        WorkflowStep.objects.schedule(
            run_id,
            name,
            function,
            {},
            queue=FUNCTIONS[function],
            queue_key=key,
            timeout=30,
            retries=0,
        )
    return run_id


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
@pytest.mark.parametrize("queues", [["to-one"], None], ids=["one-queue", "every-queue"])
def test_a_timed_out_step_of_a_full_queue_is_timed_out_and_frees_its_slot(
    sql_path: str, queues: list[str] | None
) -> None:
    """Rule: the next claim of a worker of the queue fails the attempt past its timeout
    (STEP_TIMED_OUT) even though the queue is at its concurrency, and the step waiting
    behind it is then claimed (at once or by the claim after)."""
    with tuned_sql(sql_path == "tuned"):
        _steps("tests.to.one", ["first", "second"])
        claim = WorkflowStep.objects.claim_due(LEASE, queues=queues)
        assert claim is not None and claim.step_name == "first"
        assert WorkflowStep.objects.filter(step_name="first").update(deadline_at=db_now_plus(-1))
        got = [WorkflowStep.objects.claim_due(LEASE, queues=queues) for _ in range(2)]
        first = WorkflowStep.objects.get(step_name="first")
        assert first.status == "failed", (first.status, first.error)
        assert (first.error or {}).get("code") == "STEP_TIMED_OUT", first.error
        assert [c.step_name for c in got if c is not None] == ["second"], got


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_timed_out_step_of_a_full_key_is_timed_out_and_frees_the_keys_slot(
    sql_path: str,
) -> None:
    """Rule: as above for a key at its key_concurrency: the timed-out attempt is failed and
    the key's next step is claimed."""
    with tuned_sql(sql_path == "tuned"):
        _steps("tests.to.keyed", ["first", "second"], key="t")
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["to-keyed"])
        assert claim is not None and claim.step_name == "first"
        assert WorkflowStep.objects.filter(step_name="first").update(deadline_at=db_now_plus(-1))
        got = [WorkflowStep.objects.claim_due(LEASE, queues=["to-keyed"]) for _ in range(2)]
        first = WorkflowStep.objects.get(step_name="first")
        assert first.status == "failed", (first.status, first.error)
        assert (first.error or {}).get("code") == "STEP_TIMED_OUT", first.error
        assert [c.step_name for c in got if c is not None] == ["second"], got


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_timed_out_step_of_an_unlimited_queue_is_timed_out(sql_path: str) -> None:
    """Rule: in a queue without limits, the next claim fails the attempt past its
    timeout and takes the next step."""
    with tuned_sql(sql_path == "tuned"):
        _steps("tests.to.free", ["first", "second"])
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["to-free"])
        assert claim is not None and claim.step_name == "first"
        assert WorkflowStep.objects.filter(step_name="first").update(deadline_at=db_now_plus(-1))
        got = [WorkflowStep.objects.claim_due(LEASE, queues=["to-free"]) for _ in range(2)]
        first = WorkflowStep.objects.get(step_name="first")
        assert first.status == "failed" and (first.error or {})["code"] == "STEP_TIMED_OUT"
        assert [c.step_name for c in got if c is not None] == ["second"], got


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_lapsed_step_out_of_attempts_in_a_full_queue_is_failed(sql_path: str) -> None:
    """Rule: a running step whose lease lapsed on its last attempt is failed ("lost its
    worker on every attempt", STEP_LEASE_LAPSED) by the next claim that looks for due work,
    and its run asked for a pass — failing it takes no slot, so a full queue must not keep
    it running (and its run waiting) until a slot frees."""
    with tuned_sql(sql_path == "tuned"):
        run_x = _steps("tests.to.one", ["x"])
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["to-one"])
        assert claim is not None and claim.step_name == "x"
        WorkflowStep.objects.filter(step_name="x").update(lease_expires_at=db_now_plus(-1))
        run_a = start_workflow("tests.to.idle", {})
        WorkflowStep.objects.schedule(run_a, "a", "tests.to.one", {}, queue="to-one")
        a = WorkflowStep.objects.claim_for_execution(run_a, "a", "tests.to.one", LEASE)
        assert a is not None  # x's lapsed lease holds no slot: a fills the queue
        WorkflowStep.objects.claim_due(LEASE, queues=["to-one"])
        x = WorkflowStep.objects.get(run_id=run_x, step_name="x")
        assert x.status == "failed", (x.status, x.error)
        assert (x.error or {}).get("code") == "STEP_LEASE_LAPSED", x.error
