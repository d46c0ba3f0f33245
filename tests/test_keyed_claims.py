"""The claim of a worker of one limited queue (``claim_queue`` on PostgreSQL's tuned path:
one statement; the portable path elsewhere), of a worker of limited queues and others (two
statements on the tuned path), and the pruning of idle queue-key rows.

The limits themselves, one claimer at a time, are the fairness conformance suite's
(``tests/test_workflow_fairness_conformance.py``, both paths on PostgreSQL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.clock import db_now_plus
from django_leases.models import StepStatus, WorkflowQueueKey, WorkflowRun, WorkflowStep
from django_leases.workflows import start_workflow
from tests.helpers import finish_step, limited_queues, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES = {
    "kc-keyed": {"key_concurrency": 1},
    "kc-rated": {"key_rate": "1/h"},
    "kc-capped": {"concurrency": 1},
}
FUNCTIONS = {
    "tests.kc.plain": "kc-plain",  # not configured: no limits
    "tests.kc.keyed": "kc-keyed",
    "tests.kc.rated": "kc-rated",
    "tests.kc.capped": "kc-capped",
}


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    with limited_queues(QUEUES, FUNCTIONS):
        yield


def _queue(
    key: str, names: list[str], function: str = "tests.kc.keyed", *, priority: int = 0
) -> uuid.UUID:
    run_id = start_workflow("tests.idle", {}, queue_key=key)
    for name in names:
        WorkflowStep.objects.schedule(
            run_id, name, function, {}, queue=FUNCTIONS[function], queue_key=key, priority=priority
        )
    return run_id


@pytest.mark.postgres_only
def test_a_keyed_claim_is_one_statement_and_serves_keys_in_turn() -> None:
    # Once per process: what the connection reads on first use.
    assert WorkflowStep.objects.claim_due(LEASE, queues=["kc-keyed"]) is None
    _queue("big", ["b1", "b2", "b3"])
    _queue("small", ["s1", "s2"])
    claimed = []
    for _ in range(2):
        with CaptureQueriesContext(connection) as queries:
            claim = WorkflowStep.objects.claim_due(LEASE, queues=["kc-keyed"])
        assert claim is not None
        assert len(queries) == 1, [q["sql"] for q in queries]
        assert "dl_claim_queue_" in queries[0]["sql"]
        claimed.append(claim.step_name)
    # Both keys are at their key_concurrency of 1.
    assert claimed == ["b1", "s1"]
    assert WorkflowStep.objects.claim_due(LEASE, queues=["kc-keyed"]) is None
    # Round-robin: the key claimed least recently goes first, whatever its backlog.
    for done in ("b1", "s1"):
        finish_step(done)
    order = []
    while (claim := WorkflowStep.objects.claim_due(LEASE, queues=["kc-keyed"])) is not None:
        order.append(claim.step_name)
        finish_step(claim.step_name)
    assert order == ["b2", "s2", "b3"]
    turns = dict(WorkflowQueueKey.objects.filter(queue="kc-keyed").values_list("key", "claimed_at"))
    assert turns["big"] > turns["small"]


@pytest.mark.postgres_only
def test_a_lapsed_step_of_a_limited_queue_is_taken_over_the_portable_way() -> None:
    _queue("big", ["b1"])
    first = WorkflowStep.objects.claim_due(LEASE, queues=["kc-keyed"])
    assert first is not None and first.attempt == 1
    WorkflowStep.objects.filter(pk=first.step_id).update(lease_expires_at=db_now_plus(-1.0))
    with CaptureQueriesContext(connection) as queries:
        again = WorkflowStep.objects.claim_due(LEASE, queues=["kc-keyed"])
    assert again is not None and (again.step_id, again.attempt) == (first.step_id, 2)
    assert len(queries) > 1  # the function said "lapsed"; the portable path took it over


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_the_queue_wide_concurrency_and_the_key_rate_hold_on_both_paths(sql_path: str) -> None:
    with tuned_sql(sql_path == "tuned"):
        _queue("a", ["a1"], "tests.kc.capped")
        _queue("b", ["b1"], "tests.kc.capped")
        assert WorkflowStep.objects.claim_due(LEASE, queues=["kc-capped"]) is not None
        assert WorkflowStep.objects.claim_due(LEASE, queues=["kc-capped"]) is None
        _queue("r", ["r1", "r2"], "tests.kc.rated")
        _queue("q", ["q1"], "tests.kc.rated")
        names = []
        while (claim := WorkflowStep.objects.claim_due(LEASE, queues=["kc-rated"])) is not None:
            names.append(claim.step_name)
            finish_step(claim.step_name)
        assert names == ["r1", "q1"]  # r2 waits for its key's rate window


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
@pytest.mark.parametrize("every_queue", [False, True])
def test_a_worker_of_a_limited_queue_and_another_keeps_the_order_and_the_limits(
    sql_path: str, every_queue: bool
) -> None:
    queues = None if every_queue else ["kc-plain", "kc-keyed"]
    with tuned_sql(sql_path == "tuned"):
        # Due in this order: two steps of key "big" (key_concurrency 1), one of the
        # unlimited queue, then one of key "small"; last, an unlimited step of higher
        # priority, which goes first.
        _queue("big", ["b1", "b2"])
        _queue("p", ["p1"], "tests.kc.plain")
        _queue("small", ["s1"])
        _queue("urgent", ["u1"], "tests.kc.plain", priority=5)
        claimed, counts = [], []
        for _ in range(5):
            with CaptureQueriesContext(connection) as queries:
                claim = WorkflowStep.objects.claim_due(LEASE, queues=queues)
            if claim is None:
                break
            claimed.append(claim.step_name)
            counts.append(len(queries))
        # b2 waits: its key runs b1 (key_concurrency 1). The portable path places kc-keyed
        # at the turn of the key whose turn it is (s1's "small", never claimed: first); the
        # tuned path at its first due step's key's turn (b2's "big", claimed after p1 became
        # due), so p1 goes first there: the documented difference.
        tuned = sql_path == "tuned" and connection.vendor == "postgresql"
        assert claimed == (["u1", "b1", "p1", "s1"] if tuned else ["u1", "b1", "s1", "p1"])
        if tuned:
            # The first due steps' queues read, then the claim of the first's own statement.
            assert counts == [2, 2, 2, 2], counts
        finish_step("b1")
        again = WorkflowStep.objects.claim_due(LEASE, queues=queues)
        assert again is not None and again.step_name == "b2"


@pytest.mark.postgres_only
def test_a_lapsed_step_of_a_mixed_worker_is_taken_over_the_portable_way() -> None:
    _queue("p", ["p1"], "tests.kc.plain")
    first = WorkflowStep.objects.claim_due(LEASE, queues=["kc-plain", "kc-keyed"])
    assert first is not None and first.attempt == 1
    WorkflowStep.objects.filter(pk=first.step_id).update(lease_expires_at=db_now_plus(-1.0))
    again = WorkflowStep.objects.claim_due(LEASE, queues=["kc-plain", "kc-keyed"])
    assert again is not None and (again.step_id, again.attempt) == (first.step_id, 2)


def test_prune_deletes_only_idle_key_rows() -> None:
    busy = _queue("busy", ["k1", "k2"])
    _queue("done", ["d1"])
    _queue("rated", ["r1"], "tests.kc.rated")
    for queue in ("kc-keyed", "kc-keyed", "kc-rated"):
        claim = WorkflowStep.objects.claim_due(LEASE, queues=[queue])
        assert claim is not None
        finish_step(claim.step_name)
    # Keys "busy" (k2 still waits), "done" (finished) and "rated" (its start lies within
    # its key_rate window of an hour), plus a key of a queue no longer configured.
    WorkflowQueueKey.objects.create(queue="kc-gone", key="old", claimed_at=db_now_plus(0.0))
    assert WorkflowStep.objects.filter(run_id=busy, status=StepStatus.PENDING).count() == 1
    assert WorkflowRun.objects.prune(3600) == 0
    left = set(WorkflowQueueKey.objects.values_list("queue", "key"))
    assert left == {("kc-keyed", "busy"), ("kc-rated", "rated")}
    # Cancelled: nothing of key "busy" waits in a running run any more.
    WorkflowRun.objects.filter(pk=busy).update(status="cancelled")
    assert WorkflowQueueKey.objects.prune_idle(batch_size=1) == 1
    assert set(WorkflowQueueKey.objects.values_list("queue", "key")) == {("kc-rated", "rated")}
    with pytest.raises(ValueError, match="batch_size"):
        WorkflowQueueKey.objects.prune_idle(batch_size=0)
