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
from django.db import connection, transaction

from django_leases.exceptions import FenceRefusedError, WorkflowStepSupersededError
from django_leases.fencing import step_fence
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, workflow_base
from django_leases.models import lease as lease_module
from django_leases.models.lease import EPOCH_SPAN
from django_leases.workflows import registry, start_workflow, step_function, workflow
from django_leases.workflows.engine import execute_step
from django_leases.workflows.worker import Worker
from tests.helpers import drain, lapse_step_lease, tuned_sql
from tests.workapp.models import Account, LedgerEntry

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


# -- a step fence is live only under the claim that ran it --------------------------------------
#
# After an asynchronous promotion lost a claim, the promoted server hands the same attempt of
# the same step out again, under its higher floor. The first claim's worker is still running;
# its writes reach the new primary through the same multi-host URL. Its token is below the new
# claim's (above), and it must not be live either: each claim stores its floor on the step
# row, and the fence's liveness compares it. The floor is not replaced here: each claim
# stores what the server reads, and the row is preset to another floor before it, so a claim
# that did not store its floor leaves the preset one.

#: A floor no claim on this server stores (a claim of another timeline's).
OTHER_FLOOR = 3 * EPOCH_SPAN

#: What a worker's claim_due(queues=...) takes: the unlimited one-statement claim, a limited
#: queue's own statement, and the mixed worker's (every queue, some of them limited).
CLAIMERS: dict[str, tuple[str, list[str] | None]] = {
    "unlimited": ("default", ["default"]),
    "limited": ("tests-limited", ["tests-limited"]),
    "mixed": ("default", None),
}


def _stored_floor(step_id: int) -> int:
    return int(WorkflowStep.objects.values_list("fence_floor", flat=True).get(pk=step_id))


def _claimed(claimer: str) -> Any:
    """A step of ``claimer``'s queue, scheduled, preset to ``OTHER_FLOOR``, then claimed."""
    queue, queues = CLAIMERS[claimer]
    run_id = WorkflowRun.objects.start("tests.epoch-steps", {}).id
    step = WorkflowStep.objects.schedule(run_id, "s", "tests.epoch-fence", queue=queue)
    WorkflowStep.objects.filter(pk=step.pk).update(fence_floor=OTHER_FLOOR)
    claim = WorkflowStep.objects.claim_due(30, queues=queues)
    assert claim is not None and claim.step_id == step.pk
    return claim


@pytest.mark.parametrize("claimer", sorted(CLAIMERS))
@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_every_claim_stores_the_floor_its_fence_carries(tuned: bool, claimer: str) -> None:
    with tuned_sql(tuned):
        claim = _claimed(claimer)
        assert _stored_floor(claim.step_id) == claim.fence_floor != OTHER_FLOOR
        # A takeover of the lapsed attempt stores it too.
        lapse_step_lease(claim.step_id)
        WorkflowStep.objects.filter(pk=claim.step_id).update(fence_floor=OTHER_FLOOR)
        _, queues = CLAIMERS[claimer]
        again = WorkflowStep.objects.claim_due(30, queues=queues)
        assert again is not None and (again.step_id, again.attempt) == (claim.step_id, 2)
        assert _stored_floor(again.step_id) == again.fence_floor != OTHER_FLOOR


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_steps_inserted_claimed_store_the_floor_their_fence_carries(tuned: bool) -> None:
    """The claims that insert their step (a run's next step, claimed by the write of the
    step before it or by the pass itself). On PostgreSQL the column's default is set to
    another floor meanwhile, so an insert that did not store its floor shows it."""
    floors: dict[str, tuple[int, int]] = {}

    def note(data: Any, ctx: Any) -> Any:
        step = WorkflowStep.objects.get(run_id=ctx.run_id, step_name=ctx.step_name)
        floors[ctx.step_name] = (ctx.fence.token - ctx.attempt, _stored_floor(step.pk))
        return ctx.step_name

    table = WorkflowStep._meta.db_table
    pg = connection.vendor == "postgresql"
    original = registry._step_functions["tests.epoch-fence"]
    registry._step_functions["tests.epoch-fence"] = note
    try:
        if pg:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"ALTER TABLE {table} ALTER COLUMN fence_floor SET DEFAULT {OTHER_FLOOR}"
                )
        with tuned_sql(tuned):
            run_id = start_workflow("tests.epoch-steps", {"options": {}})
            drain(Worker(1, step_lease_ttl=30, poll_interval=3600, queues=None))
    finally:
        registry._step_functions["tests.epoch-fence"] = original
        if pg:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {table} ALTER COLUMN fence_floor SET DEFAULT 0")
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert sorted(floors) == ["again", "first", "last", "left", "right"]
    assert {name: read == stored for name, (read, stored) in floors.items()} == dict.fromkeys(
        floors, True
    ), floors


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_a_claim_lost_in_a_promotion_leaves_its_worker_no_live_fence(tuned: bool) -> None:
    """Worker A's claim of attempt 1 was lost in an asynchronous promotion; the promoted
    server handed attempt 1 out again, to B, under its higher floor. A, still running,
    writes through its fence to the new primary: refused (``fenced_update``, ``strict``,
    ``lock_for_result``), before B's write and after it; B's lands."""
    with tuned_sql(tuned):
        stale = _claimed("unlimited")
        account = Account.objects.create(name=f"epoch-{stale.step_id}")
        newer_floor = stale.fence_floor + EPOCH_SPAN
        # B's claim of the same attempt on the promoted server, as it stores it.
        WorkflowStep.objects.filter(pk=stale.step_id).update(fence_floor=newer_floor)
        a = step_fence(stale.step_id, stale.attempt, floor=stale.fence_floor)
        b = step_fence(stale.step_id, stale.attempt, floor=newer_floor)
        accounts = Account.objects.filter(pk=account.pk)
        assert accounts.fenced_update(a, balance=1) == 0
        with pytest.raises(FenceRefusedError):
            accounts.fenced_update(a, strict=True, balance=1)
        with transaction.atomic(), pytest.raises(WorkflowStepSupersededError):
            WorkflowStep.objects.lock_for_result(
                stale.step_id, stale.attempt, floor=stale.fence_floor
            )
        assert accounts.fenced_update(b, balance=2) == 1
        assert accounts.fenced_update(a, balance=3) == 0
        assert Account.objects.get(pk=account.pk).balance == 2
        # B's own result is fenced as any: its transaction's lock is granted.
        with transaction.atomic():
            WorkflowStep.objects.lock_for_result(stale.step_id, stale.attempt, floor=newer_floor)
        # A caller that does not know the claim's floor judges the attempt alone.
        assert step_fence(stale.step_id, stale.attempt).token == stale.attempt
        assert WorkflowStep.objects.attempt_running(stale.step_id, stale.attempt).exists()


def test_a_transactional_step_whose_claim_was_taken_again_commits_nothing() -> None:
    """A transactional step's transaction, its attempt claimed again under another floor
    while it ran (the promoted server's claim): it rolls back, nothing of it lands; the
    next attempt lands once."""
    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.append")
    stale = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 600)
    assert stale is not None

    def retaken(data: Any, ctx: Any) -> Any:
        LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
        WorkflowStep.objects.filter(pk=stale.step_id).update(
            fence_floor=stale.fence_floor + EPOCH_SPAN
        )
        return {"attempt": ctx.attempt}

    original = registry._step_functions["tests.tx.append"]
    registry._step_functions["tests.tx.append"] = retaken
    try:
        assert execute_step(stale) == "superseded"
    finally:
        registry._step_functions["tests.tx.append"] = original
    assert not LedgerEntry.objects.filter(run_id=run.id).exists()
    assert WorkflowStep.objects.get(pk=stale.step_id).result is None


def test_a_mixed_workers_claim_fences_above_the_epoch_floor(floor: int) -> None:
    """A worker of every queue, some of them limited, claims an unlimited queue's step
    through its own statement (``claim_step_except``) beside the limited queues' claims."""
    for tuned in (True, False):
        with tuned_sql(tuned):
            run_id = WorkflowRun.objects.start("tests.epoch-steps", {}).id
            WorkflowStep.objects.schedule(run_id, "s", "tests.epoch-fence")
            claim = WorkflowStep.objects.claim_due(30)
            assert claim is not None and claim.fence_floor == floor
