"""A queue's concurrency holds however a step comes to run: a step whose lease lapsed holds no
slot (docs/howto/queues.md: "A running step whose lease lapsed … does not count: it is claimable
again, as a new attempt, and counts once claimed"), so it may not come back to life without
being admitted again — not even through ``reclaim_created`` (a write whose reply was lost)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_leases.models import Lease, WorkflowStep
from django_leases.workflows import start_workflow, workflow
from django_leases.workflows.values import NextStep, StepOptions, run_lease_key
from tests.helpers import lapse_step_lease, limited_queues, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES: dict[str, dict[str, Any]] = {"rc-one": {"concurrency": 1}}
FUNCTIONS = {"tests.rc.one": "rc-one"}


@workflow("tests.rc.idle")
def _idle(run: Any, input: Any) -> Any:
    return None


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    with limited_queues(QUEUES, FUNCTIONS):
        yield


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_lapsed_created_claim_is_not_revived_past_the_queues_concurrency(
    sql_path: str,
) -> None:
    """Rule: at most ``concurrency`` steps of a queue hold a live lease. Step A, created
    claimed by a pass (claimant ``c-a``), lapses; step B of another run is admitted into the
    freed slot; ``reclaim_created`` of A must then not renew A's lease (two live steps in a
    queue of concurrency 1)."""
    with tuned_sql(sql_path == "tuned"):
        run_a = start_workflow("tests.rc.idle", {})
        run_b = start_workflow("tests.rc.idle", {})
        opts = StepOptions(queue="rc-one", retries=3)
        created = WorkflowStep.objects.schedule_claimed(
            run_a,
            NextStep("a", "tests.rc.one", {}, opts),
            lease_ttl_seconds=LEASE,
            finish_pass=0,
            claimant="c-a",
        )
        assert created.claim is not None
        lease = Lease.objects.acquire(run_lease_key(run_a), "tests.rc-holder", 30)
        assert lease is not None
        lapse_step_lease(run_id=run_a, step_name="a")
        WorkflowStep.objects.schedule(run_b, "b", "tests.rc.one", {}, queue="rc-one")
        b = WorkflowStep.objects.claim_for_execution(run_b, "b", "tests.rc.one", LEASE)
        assert b is not None  # A's lapsed lease holds no slot: B is admitted
        WorkflowStep.objects.reclaim_created(
            run_a, "a", lease=lease, lease_ttl_seconds=LEASE, claimant="c-a"
        )
        live = list(
            WorkflowStep.objects.holding_slots()
            .filter(queue="rc-one")
            .values_list("step_name", flat=True)
        )
        assert len(live) <= 1, live


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_resumed_worker_does_not_renew_a_lapsed_lease_past_the_queues_concurrency(
    sql_path: str,
) -> None:
    """Rule: at most ``concurrency`` steps of a queue hold a live lease. A's worker stops
    (SIGSTOP) past its lease; B is admitted into the slot A's lapsed lease freed (a pass runs
    it inline); A's worker resumes and renews: the renewal must not put a second live step
    into a queue of concurrency 1 (it should be refused, as a lapsed lease is no slot)."""
    with tuned_sql(sql_path == "tuned"):
        run_a = start_workflow("tests.rc.idle", {})
        run_b = start_workflow("tests.rc.idle", {})
        WorkflowStep.objects.schedule(run_a, "a", "tests.rc.one", {}, queue="rc-one")
        a = WorkflowStep.objects.claim_due(LEASE, queues=["rc-one"])
        assert a is not None and a.step_name == "a"
        lapse_step_lease(a.step_id)
        WorkflowStep.objects.schedule(run_b, "b", "tests.rc.one", {}, queue="rc-one")
        b = WorkflowStep.objects.claim_for_execution(run_b, "b", "tests.rc.one", LEASE)
        assert b is not None  # A's lapsed lease holds no slot: B is admitted
        WorkflowStep.objects.refresh_lease(a.step_id, LEASE, a.attempt)  # A's worker resumes
        live = list(
            WorkflowStep.objects.holding_slots()
            .filter(queue="rc-one")
            .values_list("step_name", flat=True)
        )
        assert len(live) <= 1, live
