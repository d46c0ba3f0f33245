"""Queue slots and limits, however a step comes to hold or leave one (docs/howto/queues.md,
fairness.md):

- a step whose attempt ran past its ``timeout`` is failed ``STEP_TIMED_OUT`` by the next worker
  that looks for due work (docs/howto/workflows.md, *Step timeouts*), and one that lapsed on its
  last attempt is failed, also when its queue is at its concurrency (or its key at its
  ``key_concurrency``): neither keeps the slot, and the step behind it is claimable;
- a step whose lease lapsed holds no slot ("A running step whose lease lapsed … does not count:
  it is claimable again, as a new attempt, and counts once claimed"), so in a queue with limits
  it may not come back to life without being admitted again — not by its worker's renewal, nor
  through ``reclaim_created`` (a write whose reply was lost);
- a limit ``DJANGO_LEASES["QUEUES"]`` accepts (an integer from 1 to ``MAX_QUEUE_LIMIT``, a rate's
  N in that range) is honoured alike by the tuned and the portable claim, and one past it is
  refused when the setting is read — never a statement that fails and sends the process down
  the portable path for good; a bad task queue key is refused, nothing stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_leases.clock import db_now_plus
from django_leases.conf import MAX_QUEUE_LIMIT, parse_queues
from django_leases.models import Lease, WorkflowRun, WorkflowStep
from django_leases.models.workflow_base import without_functions
from django_leases.workflows import start_workflow
from django_leases.workflows.values import NextStep, StepOptions, run_lease_key
from tests.helpers import lapse_step_lease, limited_queues, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
HUGE = MAX_QUEUE_LIMIT
QUEUES: dict[str, dict[str, Any]] = {
    "to-one": {"concurrency": 1},
    "to-keyed": {"key_concurrency": 1},
    "to-free": {},
    "rc-one": {"concurrency": 1},
    "ql-conc": {"concurrency": HUGE},
    "ql-key": {"key_concurrency": HUGE},
    "ql-rate": {"rate": f"{HUGE}/s"},
}
FUNCTIONS = {
    "tests.to.one": "to-one",
    "tests.to.keyed": "to-keyed",
    "tests.to.free": "to-free",
    "tests.rc.one": "rc-one",
    "tests.ql.conc": "ql-conc",
    "tests.ql.key": "ql-key",
    "tests.ql.rate": "ql-rate",
}
#: The queues of the limits' tests.
LIMITED_FUNCTIONS = {
    name: FUNCTIONS[name] for name in ("tests.ql.conc", "tests.ql.key", "tests.ql.rate")
}


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    with limited_queues(QUEUES, FUNCTIONS):
        yield


def _steps(function: str, names: list[str], key: str | None = None) -> uuid.UUID:
    run_id = start_workflow("tests.idle", {}, queue_key=key)
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
        run_a = start_workflow("tests.idle", {})
        WorkflowStep.objects.schedule(run_a, "a", "tests.to.one", {}, queue="to-one")
        a = WorkflowStep.objects.claim_for_execution(run_a, "a", "tests.to.one", LEASE)
        assert a is not None  # x's lapsed lease holds no slot: a fills the queue
        WorkflowStep.objects.claim_due(LEASE, queues=["to-one"])
        x = WorkflowStep.objects.get(run_id=run_x, step_name="x")
        assert x.status == "failed", (x.status, x.error)
        assert (x.error or {}).get("code") == "STEP_LEASE_LAPSED", x.error


def _admit_another_in_the_lapsed_slot() -> None:
    """A step of another run is claimed in ``rc-one`` (concurrency 1), whose only running
    step's lease lapsed: the lapsed lease holds no slot."""
    other = start_workflow("tests.idle", {})
    WorkflowStep.objects.schedule(other, "b", "tests.rc.one", {}, queue="rc-one")
    assert WorkflowStep.objects.claim_for_execution(other, "b", "tests.rc.one", LEASE)


def _holding_slots_of_rc_one() -> list[str]:
    rows = WorkflowStep.objects.holding_slots().filter(queue="rc-one")
    return list(rows.values_list("step_name", flat=True))


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_lapsed_created_claim_is_not_revived_past_the_queues_concurrency(
    sql_path: str,
) -> None:
    """Rule: at most ``concurrency`` steps of a queue hold a live lease. Step A, created
    claimed by a pass (claimant ``c-a``), lapses; step B of another run is admitted into the
    freed slot; ``reclaim_created`` of A then does not renew A's lease (two live steps in a
    queue of concurrency 1): it answers ``None``, as for any claim taken over."""
    with tuned_sql(sql_path == "tuned"):
        run_a = start_workflow("tests.idle", {})
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
        _admit_another_in_the_lapsed_slot()
        reclaimed = WorkflowStep.objects.reclaim_created(
            run_a, "a", lease=lease, lease_ttl_seconds=LEASE, claimant="c-a"
        )
        assert reclaimed is None
        assert _holding_slots_of_rc_one() == ["b"]


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
@pytest.mark.parametrize("batched", [False, True], ids=["refresh_lease", "refresh_leases"])
def test_a_resumed_worker_does_not_renew_a_lapsed_lease_past_the_queues_concurrency(
    sql_path: str, batched: bool
) -> None:
    """Rule: at most ``concurrency`` steps of a queue hold a live lease. A's worker stops
    (SIGSTOP) past its lease; B is admitted into the slot A's lapsed lease freed; A's worker
    resumes and renews: the renewal is refused (``False``: its worker learns it lost the
    lease), alone or in the renewer's batch."""
    with tuned_sql(sql_path == "tuned"):
        run_a = start_workflow("tests.idle", {})
        WorkflowStep.objects.schedule(run_a, "a", "tests.rc.one", {}, queue="rc-one")
        a = WorkflowStep.objects.claim_due(LEASE, queues=["rc-one"])
        assert a is not None and a.step_name == "a"
        lapse_step_lease(a.step_id)
        _admit_another_in_the_lapsed_slot()
        if batched:
            renewed = WorkflowStep.objects.refresh_leases([(a.step_id, a.attempt, LEASE)])
            assert renewed == [False]
        else:
            assert not WorkflowStep.objects.refresh_lease(a.step_id, LEASE, a.attempt)
        assert _holding_slots_of_rc_one() == ["b"]


def test_a_lapsed_lease_of_a_queue_without_limits_is_renewed_while_nobody_took_it() -> None:
    """Rule: in a queue without limits a slow worker nobody replaced keeps its attempt: its
    renewal of a lapsed lease lands."""
    run_id = start_workflow("tests.idle", {})
    WorkflowStep.objects.schedule(run_id, "free", "tests.to.free", {}, queue="to-free")
    claim = WorkflowStep.objects.claim_due(LEASE, queues=["to-free"])
    assert claim is not None
    lapse_step_lease(claim.step_id)
    assert WorkflowStep.objects.refresh_lease(claim.step_id, LEASE, claim.attempt)
    assert WorkflowStep.objects.refresh_leases([(claim.step_id, claim.attempt, LEASE)]) == [True]


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
@pytest.mark.parametrize("function", sorted(LIMITED_FUNCTIONS))
def test_the_largest_limit_the_settings_accept_admits_a_step_on_both_paths(
    sql_path: str, function: str
) -> None:
    """Rule: the largest limit parse_queues accepts is a limit, not an error: a worker of
    the queue claims its one due step, the tuned path as the portable one, and the tuned
    path stays in use."""
    with tuned_sql(sql_path == "tuned"):
        run_id = start_workflow("tests.idle", {}, queue_key="k")
        WorkflowStep.objects.schedule(run_id, "s", function, {}, queue=FUNCTIONS[function])
        claim = WorkflowStep.objects.claim_due(LEASE, queues=[FUNCTIONS[function]])
        assert claim is not None and claim.step_name == "s"
    assert connection.alias not in without_functions


@pytest.mark.parametrize(
    "limits",
    [
        {"concurrency": MAX_QUEUE_LIMIT + 1},
        {"key_concurrency": 2**63},
        {"rate": f"{MAX_QUEUE_LIMIT + 1}/s"},
        {"key_rate": f"{2**63}/m"},
    ],
)
def test_a_limit_past_the_largest_is_refused_with_the_setting(limits: dict[str, Any]) -> None:
    """Rule: a limit past ``MAX_QUEUE_LIMIT`` is refused where the setting is read (check
    E016 reports it), naming the queue."""
    with pytest.raises(ValueError, match="huge"):
        parse_queues({"huge": limits})


def test_an_int_task_queue_key_too_long_as_text_is_refused() -> None:
    """Rule: a task's queue key is a str of 1–255 characters or an int (as text); anything
    else — here an int of 5000 digits — is refused (InvalidTask, or TaskArgumentsError as
    arguments that are not storable JSON), nothing stored."""
    pytest.importorskip("django_leases.tasks_api")
    from django_leases.exceptions import TaskArgumentsError
    from django_leases.tasks_api import InvalidTask
    from tests.workapp import tasks as t

    keyed = {
        "BACKEND": "django_leases.tasks.TaskBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"queue_key_kwarg": "tenant"},
    }
    with override_settings(TASKS={"default": keyed}):
        before = WorkflowRun.objects.count()
        with pytest.raises((InvalidTask, TaskArgumentsError), match="tenant"):
            t.echo.enqueue(tenant=10**5000)
        assert WorkflowRun.objects.count() == before
