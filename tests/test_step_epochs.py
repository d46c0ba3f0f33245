"""A step attempt's fence carries the epoch of the server that granted its claim.

After an asynchronous promotion the promoted server may never have received a claim the old
primary granted: it hands the same attempt of the same step out again. Lease tokens carry
the server's epoch for that reason (``docs/operations/replication.md``); so does the token
of ``ctx.fence``: ``Claim.fence_floor + attempt``, the floor read in the claim's own
statement or transaction. A server that never failed over has floor 0 (the token is the
attempt, ``tests/test_fencing.py``); here the floor expression is replaced by a constant, as
a promoted server's would read, and every way a step is claimed must carry it.

The failover itself (a real promotion) is ``tests/test_failover.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, workflow_base
from django_leases.models import lease as lease_module
from django_leases.models.lease import EPOCH_SPAN
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.worker import Worker
from tests.helpers import drain, lapse_step_lease, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

#: The floor a server on timeline 8 reads.
FLOOR = 7 * EPOCH_SPAN

_lock = threading.Lock()
_fences: list[tuple[str, str, int, int]] = []


@step_function("tests.epoch-fence")
def fenced(data: Any, ctx: Any) -> Any:
    """Notes (run, step, attempt, fence token); fails its first attempt when asked."""
    with _lock:
        _fences.append((str(ctx.run_id), ctx.step_name, ctx.attempt, ctx.fence.token))
    if data.get("fail_first") and ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return ctx.step_name


@workflow("tests.epoch-steps")
def epoch_steps(run: Any, input: Any) -> Any:
    options = input["options"]
    first = run.step("first", "tests.epoch-fence", {}, **options)
    again = run.step("again", "tests.epoch-fence", {"fail_first": True}, retries=2, **options)
    both = run.parallel([("left", "tests.epoch-fence", {}), ("right", "tests.epoch-fence", {})])
    last = run.step("last", "tests.epoch-fence", {}, **options)
    return [first, again, *both, last]


#: The ways steps are claimed: the tuned statements (PostgreSQL; the portable path
#: elsewhere), the portable path, and steps the one-statement write does not take.
PATHS: dict[str, tuple[bool, dict[str, Any]]] = {
    "tuned": (True, {}),
    "portable": (False, {}),
    "timeout": (True, {"timeout": 600}),
    "other-queue": (True, {"queue": "tests-other"}),
}


@pytest.fixture
def floor(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The epoch floor reads ``FLOOR`` on every backend (the claim statements' cache of
    calls is emptied before and after, so no call keeps the other floor)."""
    monkeypatch.setattr(lease_module, "epoch_floor_sql", lambda connection: str(FLOOR))
    monkeypatch.setattr(workflow_base, "epoch_floor_sql", lambda connection: str(FLOOR))
    workflow_base._calls.clear()
    yield FLOOR
    workflow_base._calls.clear()


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_way_a_step_is_claimed_fences_above_the_epoch_floor(floor: int, path: str) -> None:
    tuned, options = PATHS[path]
    _fences.clear()
    with tuned_sql(tuned):
        runs = [str(start_workflow("tests.epoch-steps", {"options": options})) for _ in range(2)]
        drain(Worker(1, step_lease_ttl=30, poll_interval=3600, queues=None))
    for run_id in runs:
        assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    seen = [fence for fence in _fences if fence[0] in runs]
    assert len(seen) == 2 * 6, seen  # five steps, one of them twice
    assert {attempt for _, step, attempt, _ in seen if step == "again"} == {1, 2}
    wrong = [(step, attempt, token) for _, step, attempt, token in seen if token != floor + attempt]
    assert wrong == []


def test_a_lapsed_attempt_taken_over_fences_above_the_epoch_floor(floor: int) -> None:
    """A takeover (the claim of a step whose lease lapsed) is the claim an asynchronous
    promotion repeats: its attempt carries the floor too, on both paths."""
    for tuned in (True, False):
        with tuned_sql(tuned):
            run_id = WorkflowRun.objects.start("tests.epoch-steps", {}).id
            WorkflowStep.objects.schedule(run_id, "s", "tests.epoch-fence")
            first = WorkflowStep.objects.claim_due(30)
            assert first is not None and first.fence_floor == floor
            lapse_step_lease(first.step_id)
            second = WorkflowStep.objects.claim_due(30)
            assert second is not None and second.step_id == first.step_id
            assert (second.attempt, second.fence_floor) == (2, floor)


def test_a_limited_queues_claim_fences_above_the_epoch_floor(floor: int) -> None:
    """A worker of one limited queue claims through its own statement (``claim_queue``)."""
    for tuned in (True, False):
        with tuned_sql(tuned):
            run_id = WorkflowRun.objects.start("tests.epoch-steps", {}).id
            WorkflowStep.objects.schedule(run_id, "s", "tests.epoch-fence", queue="tests-limited")
            claim = WorkflowStep.objects.claim_due(30, queues=["tests-limited"])
            assert claim is not None and claim.fence_floor == floor
