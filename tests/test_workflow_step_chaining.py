"""A middle step's result creates and claims the next step in the same write.

The driver replays the workflow in memory with the step's result (the dry pass it already
runs to find a completion); when that pass ends at a new ``run.step``, the result, its
attempt row, the next step (``running`` at attempt 1 under the thread's step lease) and its
attempt row are one write (``set_result_claiming_next``; one statement on PostgreSQL), the
pass the result asks for ends there, and the thread runs the next step without a pass of its
own. These tests hold the method to the rules of the two writes it replaces, on the tuned
statement and on the portable ORM path, and the driver to the outcomes an ordinary pass has.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_leases.clock import db_now
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import (
    AttemptStatus,
    Lease,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.models.workflow import ResultWithNext
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.values import (
    WORKFLOW_ERROR,
    Claim,
    NextStep,
    StepOptions,
    run_lease_key,
)
from django_leases.workflows.worker import Worker
from tests.helpers import spend_steps_first, start_blocked, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


@step_function("tests.chain")
def chained_step(data: Any, ctx: Any) -> Any:
    return {"n": data["n"], "attempt": ctx.attempt}


@step_function("tests.chain-asks")
def asking_step(data: Any, ctx: Any) -> Any:
    """Asks its own run for a pass while it runs (as an event sent meanwhile would)."""
    WorkflowRun.objects.request_pass(ctx.run_id)
    return {"n": data["n"]}


@step_function("tests.chain-looks")
def looking_step(data: Any, ctx: Any) -> Any:
    """Says whether its run has a pass due while it runs."""
    return {"due": WorkflowRun.objects.get(pk=ctx.run_id).pass_due_at is not None}


@workflow("tests.chain-four")
def four_steps(run: Any, input: Any) -> Any:
    results = []
    for n, name in enumerate(("a", "b", "c")):
        results.append(run.step(name, "tests.chain", {"n": n}))
    results.append(run.step("d", "tests.chain-looks", {}))
    return results


@workflow("tests.chain-asked")
def asked_meanwhile(run: Any, input: Any) -> Any:
    first = run.step("a", "tests.chain-asks", {"n": 1})
    looked = run.step("b", "tests.chain-looks", {})
    return [first, looked]


@workflow("tests.chain-bad-next")
def bad_next(run: Any, input: Any) -> Any:
    run.step("a", "tests.chain", {"n": 1})
    return run.step("b", "tests.chain", {"not json": {1, 2}})


@workflow("tests.chain-changes-results")
def changes_results(run: Any, input: Any) -> Any:
    first = run.step("a", "tests.chain", {"n": 1})
    first["n"] += 10  # a workflow that changes the results it was given, in place
    second = run.step("b", "tests.chain", {"n": first["n"]})
    second["n"] += 100
    third = run.step("c", "tests.chain", {"n": second["n"]})
    input["seen"] = input.get("seen", 0) + 1
    return {"third": third, "input": input}


@workflow("tests.chain-other-queue")
def other_queue(run: Any, input: Any) -> Any:
    run.step("a", "tests.chain", {"n": 1})
    return run.step("b", "tests.chain", {"n": 2}, queue="tests-other")


@pytest.fixture(params=["tuned", "portable"])
def sent_as(request: pytest.FixtureRequest) -> Iterator[str]:
    """On PostgreSQL the tuned statement, then the portable ORM path; elsewhere the portable
    path twice (it is the only one)."""
    with tuned_sql(request.param == "tuned"):
        yield str(request.param)


def claimed_first(*, asked: bool = False) -> tuple[int, Claim]:
    """A run of ``tests.chain-four`` whose first pass created step ``a`` and ended; ``a``
    claimed. Returns the ``pass_requests`` that pass read, and the claim."""
    run_id = start_workflow("tests.chain-four", {})
    read = WorkflowRun.objects.get(pk=run_id).pass_requests
    WorkflowStep.objects.schedule(run_id, "a", "tests.chain", {"n": 0})
    assert WorkflowRun.objects.finish_pass(run_id, read)
    claim = WorkflowStep.objects.claim_due(30)
    assert claim is not None and claim.step_name == "a"
    if asked:
        WorkflowRun.objects.request_pass(run_id)
    return read, claim


NEXT = NextStep("b", "tests.chain", {"n": 1})


def statements(sent: CaptureQueriesContext) -> list[str]:
    """The statements sent, but for the pooler probe a connection sends once (``db.py``)."""
    return [q["sql"] for q in sent.captured_queries if "current_setting('port')" not in q["sql"]]


def write(claim: Claim, read: int, **kwargs: Any) -> ResultWithNext:
    """The result of ``claim`` with the next step ``b`` (``kwargs`` override the call's)."""
    call: dict[str, Any] = {
        "next_step": NEXT,
        "finish_pass": read,
        "lease_ttl_seconds": 30,
        "hold_pass_seconds": 30,
    }
    call.update(kwargs)
    attempt = call.pop("attempt", claim.attempt)
    return WorkflowStep.objects.set_result_claiming_next(claim.step_id, {"n": 0}, attempt, **call)


def test_the_result_and_the_next_step_claimed_in_one_write(sent_as: str) -> None:
    read, claim = claimed_first()
    with CaptureQueriesContext(connection) as sent:
        done = write(claim, read)
    if sent_as == "tuned" and connection.vendor == "postgresql":
        assert len(statements(sent)) == 1, sent.captured_queries
    assert done.write.written and done.write.status == StepStatus.SUCCEEDED
    assert done.next is not None and done.next.claim is not None
    assert (done.next.claim.step_name, done.next.claim.attempt) == ("b", 1)
    assert done.next.claim.run_id == claim.run_id
    assert done.pass_requests == read + 1
    steps = {s.step_name: s for s in WorkflowStep.objects.filter(run_id=claim.run_id)}
    assert (steps["a"].status, steps["a"].result) == (StepStatus.SUCCEEDED, {"n": 0})
    assert (steps["b"].status, steps["b"].attempt, steps["b"].data) == (
        StepStatus.RUNNING,
        1,
        {"n": 1},
    )
    assert steps["b"].pk == done.next.claim.step_id
    assert WorkflowStep.objects.filter(pk=steps["b"].pk, lease_expires_at__gt=db_now()).exists()
    history = dict(
        WorkflowStepAttempt.objects.filter(step__run_id=claim.run_id).values_list(
            "step__step_name", "status"
        )
    )
    assert history == {"a": AttemptStatus.SUCCEEDED, "b": AttemptStatus.RUNNING}
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert (run.pass_due_at, run.pass_requests) == (None, read + 1)
    # Nobody else can claim ``b``: it is the caller's.
    assert WorkflowStep.objects.claim_due(30) is None


def test_a_pass_asked_for_meanwhile_stays_due(sent_as: str) -> None:
    read, claim = claimed_first(asked=True)
    done = write(claim, read)
    assert done.next is not None and done.next.claim is not None
    assert done.pass_requests is None
    assert WorkflowRun.objects.filter(pk=claim.run_id, pass_due_at__lte=db_now()).exists()


def test_a_superseded_attempt_writes_nothing(sent_as: str) -> None:
    read, claim = claimed_first()
    with pytest.raises(WorkflowStepSupersededError):
        write(claim, read, attempt=claim.attempt + 1)
    assert not WorkflowStep.objects.filter(run_id=claim.run_id, step_name="b").exists()
    assert WorkflowStep.objects.get(pk=claim.step_id).status == StepStatus.RUNNING


def test_a_write_repeated_after_a_lost_reply_creates_nothing_more(sent_as: str) -> None:
    read, claim = claimed_first()
    first = write(claim, read)
    again = write(claim, read)
    assert first.next is not None and first.write.written
    assert again.next is None and not again.write.written
    assert WorkflowStep.objects.filter(run_id=claim.run_id, step_name="b").count() == 1


def test_an_invalid_next_step_is_refused_before_anything_is_written(sent_as: str) -> None:
    read, claim = claimed_first()
    with pytest.raises(ValueError, match="JSON"):
        write(claim, read, next_step=NextStep("b", "tests.chain", {"bad": {1}}))
    assert WorkflowStep.objects.get(pk=claim.step_id).status == StepStatus.RUNNING
    assert not WorkflowStep.objects.filter(run_id=claim.run_id, step_name="b").exists()


def test_a_next_step_that_exists_leaves_the_pass_to_the_caller(sent_as: str) -> None:
    read, claim = claimed_first()
    WorkflowStep.objects.schedule(claim.run_id, "b", "tests.chain", {"n": 1})
    done = write(claim, read)
    assert done.next is None and done.write.written
    state = done.write.state
    assert state is not None, "the pass was not taken for the caller"
    assert state.steps["a"].status == StepStatus.SUCCEEDED
    assert state.steps["b"].status == StepStatus.PENDING
    held = WorkflowRun.objects.filter(pk=claim.run_id, pass_due_at__gt=db_now())
    assert held.exists(), "the pass was not held for the caller"


def test_a_parallel_step_that_is_not_the_last_only_counts_itself_off(sent_as: str) -> None:
    read, claim = claimed_first()
    WorkflowRun.objects.filter(pk=claim.run_id).update(branches_left=2)
    done = write(claim, read)
    assert done.next is None and done.write.written
    assert done.write.state is None and not done.write.pass_requested
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert (run.branches_left, run.pass_due_at) == (1, None)
    assert not WorkflowStep.objects.filter(run_id=claim.run_id, step_name="b").exists()


def test_a_next_step_of_another_queue_is_left_to_its_workers(sent_as: str) -> None:
    read, claim = claimed_first()
    done = write(
        claim,
        read,
        next_step=NextStep("b", "tests.chain", {"n": 1}, StepOptions(queue="tests-other")),
        queues=["default"],
    )
    assert done.next is not None and done.next.claim is None
    assert done.pass_requests == read + 1
    step = WorkflowStep.objects.get(run_id=claim.run_id, step_name="b")
    assert (step.status, step.queue) == (StepStatus.PENDING, "tests-other")
    assert WorkflowRun.objects.get(pk=claim.run_id).pass_due_at is None
    taken = WorkflowStep.objects.claim_due(30, queues=["tests-other"])
    assert taken is not None and taken.step_id == step.pk


@pytest.mark.postgres_only
@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_a_run_cancelled_while_the_write_waited_gets_no_next_step(tuned: bool) -> None:
    """The write waits for the run row (locked by a cancel in progress), which commits the
    cancel: the next step must not be created from the write's snapshot of the run."""
    with tuned_sql(tuned):
        read, claim = claimed_first()
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=claim.run_id)
            blocked = start_blocked(lambda: write(claim, read))
            assert blocked.waited, "the write did not wait for the run row"
            WorkflowRun.objects.filter(pk=claim.run_id).update(status=RunStatus.CANCELLED)
        done = blocked.result()
    assert done.next is None
    assert not WorkflowStep.objects.filter(run_id=claim.run_id, step_name="b").exists()


# -- the driver -----------------------------------------------------------------------------------


def drive(workflow_name: str, input: Any = None) -> tuple[WorkflowRun, list[str]]:
    """Start a run of ``workflow_name``; one unit of work of a fresh worker drives it.
    Returns the run and the statements that unit sent."""
    run_id = start_workflow(workflow_name, {} if input is None else input)
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    with CaptureQueriesContext(connection) as sent:
        assert worker.work_once() is True
    return WorkflowRun.objects.get(pk=run_id), statements(sent)


@pytest.mark.postgres_only
def test_a_middle_step_costs_one_statement() -> None:
    run, statements = drive("tests.chain-four")
    assert (run.status, run.pass_due_at) == (RunStatus.COMPLETED, None)
    # The pick, the first step's insert, one write per middle step (b, c, d), step d's own
    # read of its run, and the last result with the run's completion.
    assert len(statements) == 7, statements
    folded = [sql for sql in statements if sql.startswith("SELECT * FROM dl_set_result_claiming")]
    assert len(folded) == 3, statements


def test_a_chained_run_drives_to_the_outcome_a_pass_would(sent_as: str) -> None:
    run, _ = drive("tests.chain-four")
    assert run.status == RunStatus.COMPLETED
    assert run.output == [
        {"n": 0, "attempt": 1},
        {"n": 1, "attempt": 1},
        {"n": 2, "attempt": 1},
        {"due": False},
    ]
    attempts = WorkflowStepAttempt.objects.filter(step__run_id=run.id)
    assert sorted(attempts.values_list("step__step_name", "attempt", "status")) == [
        (name, 1, AttemptStatus.SUCCEEDED) for name in "abcd"
    ]
    assert Lease.objects.with_state().get(key=run_lease_key(run.id)).state == "released"


def test_a_pass_asked_for_during_a_chained_step_is_run(sent_as: str) -> None:
    run, _ = drive("tests.chain-asked")
    assert run.status == RunStatus.COMPLETED
    first, looked = run.output
    assert first == {"n": 1}
    if sent_as == "tuned" and connection.vendor == "postgresql":
        assert looked == {"due": True}, "the pass asked for was dropped"
    assert run.pass_due_at is None


def test_an_invalid_next_step_fails_the_run_as_a_pass_would(sent_as: str) -> None:
    run, _ = drive("tests.chain-bad-next")
    assert run.status == RunStatus.FAILED
    assert run.error is not None and run.error["code"] == WORKFLOW_ERROR
    assert WorkflowStep.objects.get(run_id=run.id, step_name="a").status == StepStatus.SUCCEEDED
    assert not WorkflowStep.objects.filter(run_id=run.id, step_name="b").exists()


def test_a_workflow_that_changes_its_results_in_place_sees_them_as_stored(sent_as: str) -> None:
    run, _ = drive("tests.chain-changes-results")
    assert run.status == RunStatus.COMPLETED
    data = dict(WorkflowStep.objects.filter(run_id=run.id).values_list("step_name", "data"))
    # Each step got what a pass reading the database would have given it.
    assert data == {"a": {"n": 1}, "b": {"n": 11}, "c": {"n": 111}}
    assert run.output == {"third": {"n": 111, "attempt": 1}, "input": {"seen": 1}}


def test_a_next_step_of_a_queue_the_worker_does_not_take_waits_for_its_workers(
    sent_as: str,
) -> None:
    run_id = start_workflow("tests.chain-other-queue", {})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600, queues=["default"])
    assert worker.work_once() is True
    step = WorkflowStep.objects.get(run_id=run_id, step_name="b")
    assert step.status == StepStatus.PENDING
    assert WorkflowRun.objects.get(pk=run_id).pass_due_at is None
    assert worker.work_once() is False, "the default queue's worker took another queue's step"
    other = Worker(1, step_lease_ttl=30, poll_interval=3600, queues=["tests-other"])
    assert other.work_once() is True
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"n": 2, "attempt": 1})


_ran: list[tuple[str, int]] = []


@step_function("tests.chain-counted")
def counted_step(data: Any, ctx: Any) -> Any:
    _ran.append((data["name"], ctx.attempt))
    return {"name": data["name"]}


@workflow("tests.chain-no-retries")
def no_retries(run: Any, input: Any) -> Any:
    # No retries: a step whose claim were left to lapse would fail the run.
    a = run.step("a", "tests.chain-counted", {"name": "a"}, retries=0)
    b = run.step("b", "tests.chain-counted", {"name": "b"}, retries=0)
    return [a, b]


def test_a_write_whose_reply_was_lost_keeps_the_step_it_claimed(
    sent_as: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try committed (``b`` created, claimed for this thread) but its reply was
    lost; the retry finds the result recorded. ``b`` is still this thread's: it runs at
    attempt 1, not after its lease lapsed."""
    from django.db import OperationalError

    from django_leases.models.workflow import WorkflowStepQuerySet

    _ran.clear()
    real = WorkflowStepQuerySet.set_result_claiming_next
    tries: list[ResultWithNext] = []

    def lost_reply(self: Any, *args: Any, **kwargs: Any) -> ResultWithNext:
        done = real(self, *args, **kwargs)
        tries.append(done)
        if len(tries) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(WorkflowStepQuerySet, "set_result_claiming_next", lost_reply)
    run, _ = drive("tests.chain-no-retries")
    assert len(tries) == 2 and not tries[1].write.written
    assert _ran == [("a", 1), ("b", 1)]
    assert (run.status, run.output) == (RunStatus.COMPLETED, [{"name": "a"}, {"name": "b"}])


def test_a_created_step_is_not_reclaimed_without_the_run_lease(sent_as: str) -> None:
    read, claim = claimed_first()
    lease = Lease.objects.acquire(run_lease_key(claim.run_id), "tests.first-holder", 30)
    assert lease is not None
    done = write(claim, read, claimant="tests-claimant")
    assert done.next is not None
    store = WorkflowStep.objects
    mine = {"lease": lease, "lease_ttl_seconds": 30, "claimant": "tests-claimant"}
    again = store.reclaim_created(claim.run_id, "b", **mine)
    assert again is not None and again.claim is not None and again.claim.attempt == 1
    # Another holder took the run lease since (its token is higher): not this caller's.
    assert Lease.objects.release(lease)
    taken = Lease.objects.acquire(run_lease_key(claim.run_id), "tests.other-holder", 30)
    assert taken is not None and taken.token > lease.token
    assert store.reclaim_created(claim.run_id, "b", **mine) is None


def test_a_created_step_is_reclaimed_only_by_the_claimant_its_claim_names(sent_as: str) -> None:
    """The claim ``b`` was created with names its writer; another name (another write's, or
    none: a claim another worker made) never adopts it."""
    read, claim = claimed_first()
    lease = Lease.objects.acquire(run_lease_key(claim.run_id), "tests.first-holder", 30)
    assert lease is not None
    done = write(claim, read, claimant="tests-claimant")
    assert done.next is not None and done.next.claim is not None
    assert WorkflowStep.objects.get(pk=done.next.claim.step_id).claimant == "tests-claimant"
    store = WorkflowStep.objects
    other = store.reclaim_created(
        claim.run_id, "b", lease=lease, lease_ttl_seconds=30, claimant="tests-other"
    )
    assert other is None
    with pytest.raises(ValueError, match="claimant"):
        store.reclaim_created(claim.run_id, "b", lease=lease, lease_ttl_seconds=30, claimant="")


def test_a_step_run_just_before_the_run_lease_is_lost_keeps_its_result(
    sent_as: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``b`` ran inline at attempt 1; then the run lease is seen lost, before the write that
    would carry ``b``'s result with the run's completion. The result is written on its own
    (fenced to its attempt, under its own step lease) and asks any worker for the run's
    pass; nothing runs twice."""
    from django_leases.exceptions import LeaseLostError
    from django_leases.leases import HeldLease

    _ran.clear()
    real = HeldLease.check

    def lost_once_b_ran(self: HeldLease) -> None:
        if ("b", 1) in _ran:
            raise LeaseLostError(self.key)
        real(self)

    monkeypatch.setattr(HeldLease, "check", lost_once_b_ran)
    run, _ = drive("tests.chain-no-retries")
    assert _ran == [("a", 1), ("b", 1)]
    step = WorkflowStep.objects.get(run_id=run.id, step_name="b")
    assert (step.status, step.attempt) == (StepStatus.SUCCEEDED, 1)
    assert WorkflowRun.objects.get(pk=run.id).status == RunStatus.RUNNING
    monkeypatch.setattr(HeldLease, "check", real)
    WorkflowRun.objects.request_pass(run.id)  # not the second the lost lease's retry waits
    Lease.objects.filter(key=run_lease_key(run.id)).update(expires_at=db_now())
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    assert worker.work_once() is True
    run = WorkflowRun.objects.get(pk=run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, [{"name": "a"}, {"name": "b"}])
    assert _ran == [("a", 1), ("b", 1)]


def test_a_next_step_that_exists_already_is_not_taken_for_ours() -> None:
    """On the portable path the result and the next step are one transaction; a step of that
    name that exists already (created by a pass of another holder) is not this call's: the
    result is written, no step is claimed, and the pass the result takes stays the caller's
    to run for real — never ended on a step nobody runs."""
    with tuned_sql(False):
        read, claim = claimed_first()
        WorkflowStep.objects.schedule(claim.run_id, "b", "tests.chain", {"n": 1})
        done = write(claim, read)
    assert done.next is None and done.write.written and done.write.state is not None
    held = WorkflowRun.objects.filter(pk=claim.run_id, pass_due_at__gt=db_now())
    assert held.exists(), "the pass was ended although nobody runs it"
