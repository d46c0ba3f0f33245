"""The plans PostgreSQL makes for the hot-path statements stay cheap on a fresh connection.

Each statement the lease and workflow hot paths send (and each statement inside the functions
the migrations install) is planned on a **fresh** server connection, as with Django's default
``CONN_MAX_AGE = 0``, once with custom plans and once with generic ones
(``plan_cache_mode``), and every plan is read back with ``auto_explain``. A plan must not be
JIT-compiled and no node may cost more than :data:`COST_BOUND`: a node the planner had to
take although it was switched off (``enable_sort = off`` and the like) costs about 1e10 and
fails here, as does any plan whose cost would cross ``jit_above_cost``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_leases.models import Lease, RunStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import spend_steps_first

# psycopg 3: the plans are read from the server's notices (add_notice_handler); they do not
# depend on the driver.
pytestmark = [pytest.mark.psycopg3_only, pytest.mark.django_db(transaction=True)]

#: Highest cost a node of a hot-path plan may have: far below PostgreSQL's default
#: ``jit_above_cost`` (100,000) and below any plan with a disabled node (~1e10).
COST_BOUND = 10_000.0


@step_function("tests.plans")
def plan_step(data: Any, ctx: Any) -> Any:
    return {"n": data["n"]}


@workflow("tests.plans-one")
def one_step(run: Any, input: Any) -> Any:
    return run.step("only", "tests.plans", {"n": 1})


@workflow("tests.plans-two")
def two_steps(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.plans", {"n": 1})
    return [first, run.step("second", "tests.plans", {"n": 2})]


@workflow("tests.plans-then-sleep")
def then_sleep(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.plans", {"n": 1})
    run.sleep("nap", 0)
    return first


@contextmanager
def explained(plan_cache_mode: str) -> Iterator[list[dict[str, Any]]]:
    """Every plan made on a fresh connection while the block runs (``auto_explain``, JSON)."""
    connection.close()
    connection.ensure_connection()
    plans: list[dict[str, Any]] = []

    def collect(diagnostic: Any) -> None:
        text = diagnostic.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    raw = connection.connection
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"),
            ("plan_cache_mode", plan_cache_mode),
            ("client_min_messages", "log"),
        ):
            cursor.execute("SELECT set_config(%s, %s, false)", [setting, value])
    raw.add_notice_handler(collect)
    try:
        yield plans
    finally:
        raw.remove_notice_handler(collect)
        connection.close()


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def _problems(plans: list[dict[str, Any]]) -> list[str]:
    found = []
    for plan in plans:
        text = " ".join(plan.get("Query Text", "").split())[:160]
        if "JIT" in plan:
            found.append(f"JIT-compiled: {text}")
        for node in _nodes(plan["Plan"]):
            if node["Total Cost"] > COST_BOUND:
                found.append(f"a {node['Node Type']} node costs {node['Total Cost']:,.0f}: {text}")
                break
    return found


def _drive_the_hot_paths() -> None:
    """Send every hot-path statement at least once."""
    # Leases: acquire, refresh, release; release_held (a worker's final check).
    lease = Lease.objects.acquire("tests.plans", "holder", 30)
    assert lease is not None
    assert Lease.objects.refresh(lease, 30) is not None
    assert Lease.objects.release(lease)
    lease = Lease.objects.acquire("tests.plans", "holder", 30)
    assert lease is not None and Lease.objects.release_held(lease) is True
    # A worker that chains runs: each completion also picks the next run with its lease.
    chained = [start_workflow("tests.plans-one", {}) for _ in range(2)]
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker)
    assert worker.work_once() is True
    # A worker that does not chain (it looks for due steps first on every unit): its
    # completion picks no next run.
    alone = start_workflow("tests.plans-one", {})
    assert Worker(1, step_lease_ttl=30, poll_interval=0).work_once() is True
    # Two steps: the first result creates and claims the second for the worker.
    two = start_workflow("tests.plans-two", {})
    assert Worker(1, step_lease_ttl=30, poll_interval=0).work_once() is True
    # A step, then a sleep: the result takes the next pass for the worker, with the run's
    # state.
    slept = start_workflow("tests.plans-then-sleep", {})
    assert Worker(1, step_lease_ttl=30, poll_interval=0).work_once() is True
    # A due step claimed from the queue.
    queued = start_workflow("tests.plans-one", {})
    WorkflowStep.objects.schedule(queued, "only", "tests.plans", {"n": 1})
    claim = WorkflowStep.objects.claim_due(30)
    assert claim is not None
    # Its worker takes the run's lease and pass before it writes the result.
    taken = WorkflowRun.objects.take_pass(queued, 30, "tests.plans-holder")
    assert taken is not None and taken.lease is not None
    # A result written on its own, the run's pass taken for its writer (a pass that starts
    # over after a step's failure writes so), and one asking any worker for the pass.
    assert WorkflowStep.objects.set_result(claim.step_id, {"n": 1}, 1, hold_pass_seconds=30)
    again = start_workflow("tests.plans-one", {})
    WorkflowStep.objects.schedule(again, "only", "tests.plans", {"n": 1})
    claim = WorkflowStep.objects.claim_due(30)
    assert claim is not None and WorkflowStep.objects.set_result(claim.step_id, {"n": 1}, 1)
    # A result that completes its run without a held run lease (a task's): alone, with the
    # pick of the next due pass, and with the claim of the next due step.
    completed = []
    for extra in (
        {},
        {"next_pass_holder": "tests.plans-next"},
        {"next_step_ttl": 30, "next_step_queues": ["default"]},
    ):
        run_id = start_workflow("tests.plans-one", {})
        WorkflowStep.objects.schedule(run_id, "only", "tests.plans", {"n": 1})
        claim = WorkflowStep.objects.claim_due(30, queues=["default"])
        assert claim is not None and claim.run_id == run_id
        done = WorkflowStep.objects.set_result_completing_run(
            claim.step_id,
            {"n": 1},
            claim.attempt,
            output={"n": 1},
            lease=None,
            lease_holder="tests.plans-instant",
            **extra,  # type: ignore[arg-type]
        )
        assert done.completed
        completed.append(run_id)
    # A claim of a queue with limits (queue-wide and per key): one function, under the
    # queue's lock.
    configured = dict(getattr(settings, "DJANGO_LEASES", {}) or {})
    configured["QUEUES"] = {
        **(configured.get("QUEUES") or {}),
        "tests.plans-keyed": {
            "concurrency": 8,
            "rate": "100/s",
            "key_concurrency": 2,
            "key_rate": "100/s",
        },
        # The statements of the queues of one shape: keyed without rates, a concurrency alone.
        "tests.plans-keyed-only": {"key_concurrency": 2},
        "tests.plans-counted": {"concurrency": 2},
    }
    with override_settings(DJANGO_LEASES=configured):
        for queue in ("tests.plans-keyed", "tests.plans-keyed-only", "tests.plans-counted"):
            for key in ("big", "small"):
                keyed = start_workflow("tests.plans-one", {}, queue_key=key)
                WorkflowStep.objects.schedule(
                    keyed, "only", "tests.plans", {"n": 1}, queue=queue, queue_key=key
                )
            for _ in range(2):
                claim = WorkflowStep.objects.claim_due(30, queues=[queue])
                assert claim is not None
                WorkflowRun.objects.cancel(claim.run_id)
        # A worker of a limited queue and another: the other queues' claim excludes it.
        mixed = start_workflow("tests.plans-one", {})
        WorkflowStep.objects.schedule(mixed, "only", "tests.plans", {"n": 1})
        claim = WorkflowStep.objects.claim_due(30, queues=["default", "tests.plans-counted"])
        assert claim is not None and claim.run_id == mixed
        WorkflowRun.objects.cancel(mixed)
    for run_id in (*chained, alone, two, slept, *completed):
        assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_no_hot_path_plan_is_jit_compiled_or_costly(plan_cache_mode: str) -> None:
    with explained(plan_cache_mode) as plans:
        _drive_the_hot_paths()
    texts = [" ".join(plan.get("Query Text", "").split()) for plan in plans]
    # The run-completing statement was planned (inside its function where installed).
    assert any("SET status = 'completed'" in t for t in texts), texts
    # So were the result that claims the next step, and the one that takes the next pass.
    assert any("FOR SHARE OF r ON CONFLICT (run_id, step_name)" in t for t in texts), texts
    assert any("THEN r.pass_due_at ELSE statement_timestamp()" in t for t in texts), texts
    # And the claims of a queue with limits: any, keyed without rates, a concurrency alone.
    assert any("firsts AS" in t and "rated AS" in t for t in texts), texts
    assert any("firsts AS" in t and "rated AS" not in t for t in texts), texts
    assert any("< p_concurrency AND s.status IN" in t for t in texts), texts
    assert any("NOT (s.queue = ANY (p_excluded))" in t for t in texts), texts
    assert _problems(plans) == []


def test_the_check_fails_on_a_plan_with_a_disabled_sort() -> None:
    """The bound is real: a statement that must sort with sorts switched off is caught."""
    with explained("force_custom_plan") as plans, connection.cursor() as cursor:
        cursor.execute("SET enable_sort = off")
        cursor.execute("SELECT key FROM django_leases_lease ORDER BY holder LIMIT 1")
        cursor.execute("RESET enable_sort")
    problems = _problems(plans)
    assert any(problem.startswith("a Limit node costs 10,000,") for problem in problems), problems
