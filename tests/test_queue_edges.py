"""Queues and timing at their edges: what an operator's queue view shows agrees with what the
claim counts (a failed run's step still running holds its slot; a step whose worker died is
waiting again), a debounced start keeps what it does not replace, and a queue key cannot forge
rows of a command's table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import registry, start_workflow, step_function, workflow
from django_leases.workflows.display import queue_overview
from django_leases.workflows.worker import Worker
from tests.helpers import drain, run_of

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES = {"qe-one": {"concurrency": 1}}


def _work(data: Any, ctx: Any) -> Any:
    return {"step": ctx.step_name}


@pytest.fixture(autouse=True)
def queued() -> Iterator[None]:
    with override_settings(DJANGO_LEASES={"QUEUES": QUEUES}):
        step_function("tests.queue-edges.one", queue="qe-one")(_work)
        try:
            yield
        finally:
            registry._step_functions.pop("tests.queue-edges.one", None)
            registry._step_options.pop("tests.queue-edges.one", None)


@step_function("tests.queue-edges.plain")
def plain(data: Any, ctx: Any) -> Any:
    return data


@step_function("tests.queue-edges.bad")
def bad(data: Any, ctx: Any) -> Any:
    raise RuntimeError("boom")


@workflow("tests.queue-edges.idle")
def idle(run: Any, input: Any) -> Any:
    return run.step("never", "tests.queue-edges.plain", {})


@workflow("tests.queue-edges.fan-fails")
def fan_fails(run: Any, input: Any) -> Any:
    """A step of the limited queue beside one that fails for good: the run fails while
    the first may still be running."""
    return run.parallel(
        [("slow", "tests.queue-edges.one", {}), ("bad", "tests.queue-edges.bad", {})], retries=0
    )


def test_a_failed_runs_running_step_is_counted_alike_by_the_claim_and_the_overview() -> None:
    """A run fails (a parallel branch failed for good) while its step of a concurrency-1
    queue is running. The claim still counts that step against the queue, but
    ``queue_overview`` (the admin page, ``workflow_queues list``) counts only steps of
    running runs: it showed the queue with 0 running of 1 and a step waiting, yet nothing was
    claimed. Both now count the steps that hold a slot (``holding_slots``)."""
    run_id = start_workflow("tests.queue-edges.fan-fails", {})
    passes = Worker(step_lease_ttl=LEASE, queues=["default"])
    assert passes.work_once()  # the first pass: both steps scheduled
    held = WorkflowStep.objects.claim_due(LEASE, queues=["qe-one"])
    assert held is not None and held.step_name == "slow"
    drain(passes)  # "bad" fails for good, the next pass fails the run
    assert run_of(run_id).status == RunStatus.FAILED
    assert WorkflowStep.objects.get(pk=held.step_id).status == StepStatus.RUNNING

    other = start_workflow("tests.queue-edges.idle", {})
    WorkflowStep.objects.schedule(other, "next", "tests.queue-edges.one", {}, queue="qe-one")
    row = {q.name: q for q in queue_overview()}["qe-one"]
    claim = WorkflowStep.objects.claim_due(LEASE, queues=["qe-one"])
    shown = (row.waiting, row.running, row.concurrency)
    assert claim is not None or row.running >= 1, (
        f"the overview shows waiting/running/limit {shown}: a free slot and a waiting step, "
        "but the claim admits nothing"
    )


def test_a_debounced_start_without_a_deadline_keeps_the_pending_runs_deadline() -> None:
    """docs/howto/timing.md: a start while one is pending "replaces its input (and its
    deadline, if you give one)": a replacing start that gives no deadline keeps the pending
    run's (before, it dropped it, and the run could run for ever)."""
    first = start_workflow(
        "tests.queue-edges.idle", {"v": 1}, debounce_key="doc-1", debounce=60, deadline=3600
    )
    assert WorkflowRun.objects.get(pk=first).deadline_at is not None
    again = start_workflow("tests.queue-edges.idle", {"v": 2}, debounce_key="doc-1", debounce=60)
    assert again == first
    run = WorkflowRun.objects.get(pk=first)
    assert run.input == {"v": 2}
    assert run.deadline_at is not None, "the pending run's deadline was dropped"


def test_a_step_whose_worker_died_is_shown_by_the_overview() -> None:
    """A step of a limited queue whose worker died (its step lease lapsed) is claimable
    again (docs/howto/queues.md) — due work: the overview counts it as waiting (before, it
    counted it neither as waiting nor as running, and the queue looked empty)."""
    from tests.helpers import lapse_step_lease

    run_id = start_workflow("tests.queue-edges.idle", {})
    WorkflowStep.objects.schedule(run_id, "a", "tests.queue-edges.one", {}, queue="qe-one")
    assert WorkflowStep.objects.claim_due(LEASE, queues=["qe-one"]) is not None
    lapse_step_lease(run_id=run_id, step_name="a")
    row = {q.name: q for q in queue_overview()}["qe-one"]
    shown = (row.waiting, row.running, row.oldest_waiting)
    again = WorkflowStep.objects.claim_due(LEASE, queues=["qe-one"])
    assert again is not None and again.attempt == 2, "the step was due: it is claimed again"
    assert row.waiting + row.running == 1, (
        f"the overview shows waiting/running/oldest {shown} for a queue with one due step"
    )


def test_workflow_queues_table_cannot_be_forged_by_a_queue_key() -> None:
    """A queue key is any 1–255 character string (newlines allowed) — tenants' names, often
    from user input. ``workflow_queues list`` escapes a newline in a table cell, so a key
    cannot add lines that read as rows of other keys with made-up counts."""
    import io

    from django.core.management import call_command

    forged = "tenant-1\nevil         7        9000"
    keyed = {**QUEUES, "qe-keyed": {"key_concurrency": 1}}
    with override_settings(DJANGO_LEASES={"QUEUES": keyed}):
        run_id = start_workflow("tests.queue-edges.idle", {}, queue_key=forged)
        WorkflowStep.objects.schedule(
            run_id, "k", "tests.queue-edges.one", {}, queue="qe-keyed", queue_key=forged
        )
        out = io.StringIO()
        call_command("workflow_queues", "list", stdout=out)
    lines = out.getvalue().splitlines()
    assert not any(line.startswith("evil ") for line in lines), (
        "a queue key's newline forged a row of the busiest-keys table:\n" + out.getvalue()
    )
