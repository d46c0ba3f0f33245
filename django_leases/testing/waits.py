"""A conformance suite for durable waits, fan-out, child runs, idempotent starts and step
timeouts (DESIGN §5a), runnable against your own database.

The rules, pinned on the store's QuerySet methods (what the engine calls):

* W1–W8 — ``WorkflowWait.objects``: a sleep's end is recorded once on the database clock; an
  event is delivered exactly once (kept when early, refused a second time, one of many
  concurrent senders wins); an event and its timeout are decided by one compare-and-set;
  an unknown or finished run is refused with nothing stored; an early event never claims
  a name the run reaches as a sleep or a child run (it is dropped, never delivered);
* P1–P2 — ``WorkflowStep.objects.schedule_many``: many steps in one write, idempotently; a
  superseded attempt cannot complete a parallel step;
* K1–K2 — ``WorkflowRun.objects.start(..., key=...)``: one run per workflow and key, also
  under concurrent starts;
* H1–H3 — child runs: a child's end wakes its parent in the same write; a superseded
  attempt cannot finish a child; cancelling a parent cancels its live descendants;
* T1 — a step attempt past its ``timeout`` is failed by the next claim and its late result
  refused.

Mix :class:`WorkflowWaitConformanceTests` into a ``TransactionTestCase`` (the races use
threads, each with its own connection)::

    from django.test import TransactionTestCase

    from django_leases.testing.waits import WorkflowWaitConformanceTests


    class WorkflowWaits(WorkflowWaitConformanceTests, TransactionTestCase):
        workflow_database = "default"
        databases = {"default"}

Time is never waited for: a sleep, a timeout or a lease is made to have passed by moving its
time a second into the past on the database clock (:meth:`pass_time`, the harness hook).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django_leases.clock import DbNow, db_now_plus
from django_leases.exceptions import (
    WorkflowEventRefusedError,
    WorkflowRunStateError,
    WorkflowStepSupersededError,
)
from django_leases.models import Lease, WorkflowRun, WorkflowWait
from django_leases.testing.base import WorkflowConformanceSuite
from django_leases.testing.workflows import run_together
from django_leases.workflows.values import (
    RUN_CANCELLED,
    STEP_TIMED_OUT,
    RunStatus,
    StepStatus,
    WaitKind,
    WaitStatus,
)

if TYPE_CHECKING:
    from django_leases.models.wait import WorkflowWaitQuerySet

#: The workflow name the suite's runs carry (never registered: no pass is run).
WORKFLOW = "django_leases.conformance.waits"
FUNCTION = "django_leases.conformance.work"
LEASE = 60.0
#: How many senders W6 and starters K2 race.
RACERS = 8


class WorkflowWaitConformanceTests(WorkflowConformanceSuite):
    """Rules W1–W8, P1–P2, K1–K2, H1–H3 and T1 as ``test_*`` methods; mix into
    ``TransactionTestCase``. Override :attr:`workflow_database` for another alias."""

    # -- the harness ------------------------------------------------------------------------

    def pass_time(self, run_id: uuid.UUID, name: str) -> None:
        """**Harness hook.** Make wait ``name``'s due time (a sleep's end, an event's
        timeout) a second ago on the database clock."""
        self.waits.filter(run_id=run_id, name=name).update(due_at=db_now_plus(-1))

    @property
    def waits(self) -> WorkflowWaitQuerySet:
        """``WorkflowWait`` rows on :attr:`workflow_database` (a ``WorkflowWaitQuerySet``)."""
        return WorkflowWait.objects.db_manager(self.workflow_database).all()

    def start(self, **options: Any) -> uuid.UUID:
        """Start a run of the suite's workflow (``options`` go to ``start``); its id."""
        return self.runs.start(WORKFLOW, {}, **options).id

    def due_now(self, run_id: uuid.UUID) -> bool:
        """Whether run ``run_id``'s next pass is due now on the database clock (``bool``)."""
        return self.runs.filter(pk=run_id, pass_due_at__lte=DbNow()).exists()

    # -- W: waits ---------------------------------------------------------------------------

    def test_w1_a_sleeps_end_is_recorded_once_on_the_database_clock(self) -> None:
        """W1: a sleep's end is recorded once on the database clock."""
        run_id = self.start()
        wait = self.waits.reach(run_id, "nap", WaitKind.SLEEP, seconds=3600)
        ahead = self.waits.filter(
            pk=wait.pk, due_at__gt=db_now_plus(3590), due_at__lte=db_now_plus(3600)
        )
        self.assertTrue(ahead.exists())
        again = self.waits.reach(run_id, "nap", WaitKind.SLEEP, seconds=5)
        self.assertEqual(again.due_at, wait.due_at, "a replay never recomputes the end")
        self.assertFalse(again.is_over())
        self.pass_time(run_id, "nap")
        settled = self.waits.settle(self.waits.reach(run_id, "nap", WaitKind.SLEEP, seconds=5))
        self.assertEqual(settled.status, WaitStatus.DONE)

    def test_w2_a_wait_name_keeps_its_kind(self) -> None:
        """W2: a wait name keeps its kind."""
        run_id = self.start()
        self.waits.reach(run_id, "x", WaitKind.SLEEP, seconds=1)
        before = list(self.waits.filter(run_id=run_id).values())
        with self.assertRaisesRegex(ValueError, "recorded as a sleep wait"):
            self.waits.reach(run_id, "x", WaitKind.EVENT)
        with self.assertRaises(WorkflowEventRefusedError):
            self.waits.send_event(run_id, "x", {})
        self.assertEqual(list(self.waits.filter(run_id=run_id).values()), before)

    def test_w3_an_early_event_is_kept_and_consumed_when_the_wait_is_reached(self) -> None:
        """W3: an early event is kept and consumed when the wait is reached."""
        run_id = self.start()
        self.waits.send_event(run_id, "go", {"n": 1})
        reached = self.waits.reach(run_id, "go", WaitKind.EVENT, seconds=60)
        self.assertEqual((reached.status, reached.payload), (WaitStatus.DONE, {"n": 1}))
        self.assertIsNotNone(reached.reached_at)
        self.assertIsNone(reached.due_at, "the event was there first: no timeout recorded")

    def test_w4_an_event_wakes_its_run_and_a_second_one_is_refused(self) -> None:
        """W4: an event wakes its run and a second one is refused."""
        run_id = self.start()
        self.runs.finish_pass(run_id, 1)
        self.waits.reach(run_id, "go", WaitKind.EVENT)
        self.assertFalse(self.due_now(run_id))
        self.waits.send_event(run_id, "go", "first")
        self.assertTrue(self.due_now(run_id), "the event and the wake-up commit together")
        before = list(self.waits.filter(run_id=run_id).values())
        with self.assertRaisesRegex(WorkflowEventRefusedError, "already sent"):
            self.waits.send_event(run_id, "go", "second")
        self.assertEqual(list(self.waits.filter(run_id=run_id).values()), before)

    def test_w5_an_event_and_its_timeout_have_one_outcome(self) -> None:
        """W5: an event and its timeout have one outcome."""
        late = self.start()
        wait = self.waits.reach(late, "go", WaitKind.EVENT, seconds=60)
        self.pass_time(late, "go")
        self.assertEqual(
            self.waits.settle(self.waits.reach(late, "go", WaitKind.EVENT)).status,
            WaitStatus.TIMED_OUT,
        )
        with self.assertRaisesRegex(WorkflowEventRefusedError, "timed out"):
            self.waits.send_event(late, "go", "too late")
        # Judged on the database clock: once the timeout has passed an event is refused,
        # also before any pass recorded the timeout, and nothing changes.
        unseen = self.start()
        self.waits.reach(unseen, "go", WaitKind.EVENT, seconds=60)
        self.pass_time(unseen, "go")
        before = list(self.waits.filter(run_id=unseen).values())
        with self.assertRaisesRegex(WorkflowEventRefusedError, "timed out"):
            self.waits.send_event(unseen, "go", "too late")
        self.assertEqual(list(self.waits.filter(run_id=unseen).values()), before)
        just_in_time = self.start()
        wait = self.waits.reach(just_in_time, "go", WaitKind.EVENT, seconds=60)
        self.waits.send_event(just_in_time, "go", "in time")
        self.pass_time(just_in_time, "go")
        settled = self.waits.settle(wait)
        self.assertEqual((settled.status, settled.payload), (WaitStatus.DONE, "in time"))

    def test_w6_exactly_one_of_many_concurrent_senders_is_accepted(self) -> None:
        """W6: exactly one of many concurrent senders is accepted."""
        run_id = self.start()
        self.waits.reach(run_id, "go", WaitKind.EVENT)
        outcomes = run_together(
            *(lambda n=n: self.waits.send_event(run_id, "go", {"sender": n}) for n in range(RACERS))
        )
        accepted = [value for value, error in outcomes if error is None]
        refused = [error for _, error in outcomes if error is not None]
        self.assertEqual(len(accepted), 1, outcomes)
        self.assertTrue(all(isinstance(e, WorkflowEventRefusedError) for e in refused), refused)

    def test_w7_an_unknown_or_finished_run_is_refused_with_nothing_stored(self) -> None:
        """W7: an unknown or finished run is refused with nothing stored."""
        with self.assertRaises(WorkflowRun.DoesNotExist):
            self.waits.send_event(uuid.uuid4(), "go", {})
        run_id = self.start()
        self.runs.complete(run_id, None)
        with self.assertRaises(WorkflowRunStateError):
            self.waits.send_event(run_id, "go", {})
        with self.assertRaises(ValueError):
            self.waits.send_event(self.start(), "go", {"x": object()})
        self.assertFalse(self.waits.filter(name="go").exists())

    # -- P: fan-out -------------------------------------------------------------------------

    def test_w8_a_kept_event_yields_its_name_to_a_sleep_or_child_the_run_reaches(
        self,
    ) -> None:
        """W8: an event kept for a name the run has not reached yields it to a sleep or a
        child run the run reaches under it: the event is dropped, never delivered, the
        wait proceeds, and a later event of the name is refused."""
        run_id = self.start()
        self.waits.send_event(run_id, "nap", {"n": 1})
        sleep = self.waits.reach(run_id, "nap", WaitKind.SLEEP, seconds=3600)
        self.assertEqual(
            (sleep.kind, sleep.status, sleep.payload), (WaitKind.SLEEP, WaitStatus.WAITING, None)
        )
        self.assertIsNotNone(sleep.reached_at)
        ahead = self.waits.filter(
            pk=sleep.pk, due_at__gt=db_now_plus(3590), due_at__lte=db_now_plus(3600)
        )
        self.assertTrue(ahead.exists(), "the sleep's end: database now + seconds")
        with self.assertRaisesRegex(WorkflowEventRefusedError, "sleep wait"):
            self.waits.send_event(run_id, "nap", {"n": 2})
        self.waits.send_event(run_id, "kid", {"n": 3})
        child = self.waits.start_child(run_id, "kid", WORKFLOW, {"c": 1})
        self.assertEqual((child.kind, child.status, child.payload), ("child", "waiting", None))
        self.assertIsNotNone(child.child)
        self.assertEqual(self.runs.filter(parent_id=run_id).get().pk, child.child_id)
        with self.assertRaisesRegex(WorkflowEventRefusedError, "child wait"):
            self.waits.send_event(run_id, "kid", {"n": 4})
        self.assertEqual(self.waits.filter(run_id=run_id).count(), 2)

    def test_p1_many_steps_are_scheduled_in_one_write_idempotently(self) -> None:
        """P1: many steps are scheduled in one write idempotently."""
        run_id = self.start()
        calls = [(f"s{n}", FUNCTION, {"n": n}) for n in range(300)]
        found = self.steps.schedule_many(run_id, calls)
        self.assertEqual(len(found), 300)
        due = self.steps.filter(run_id=run_id, status=StepStatus.PENDING, available_at__lte=DbNow())
        self.assertEqual(due.count(), 300)
        again = self.steps.schedule_many(run_id, calls)
        self.assertEqual({s.pk for s in again.values()}, {s.pk for s in found.values()})
        with self.assertRaisesRegex(ValueError, "recorded with step function"):
            self.steps.schedule_many(run_id, [("s0", "another.function", {})])

    def test_p2_a_superseded_attempt_cannot_complete_a_parallel_step(self) -> None:
        """P2: a superseded attempt cannot complete a parallel step."""
        run_id = self.start()
        self.steps.schedule_many(run_id, [("a", FUNCTION, {}), ("b", FUNCTION, {})])
        stale = self.steps.claim_for_execution(run_id, "a", FUNCTION, LEASE)
        assert stale is not None
        self.steps.filter(pk=stale.step_id).update(lease_expires_at=db_now_plus(-1))
        current = self.steps.claim_for_execution(run_id, "a", FUNCTION, LEASE)
        assert current is not None
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(stale.step_id, "stale", stale.attempt)
        self.assertEqual(self.steps.get(pk=stale.step_id).status, StepStatus.RUNNING)

    # -- K: idempotent starts ---------------------------------------------------------------

    def test_k1_one_run_per_workflow_and_key(self) -> None:
        """K1: one run per workflow and key."""
        first = self.runs.start(WORKFLOW, {"n": 1}, key="k")
        again = self.runs.start(WORKFLOW, {"n": 2}, key="k")
        self.assertEqual((again.id, again.started), (first.id, False))
        other = self.runs.start(WORKFLOW + ".other", {}, key="k")
        self.assertTrue(other.started)
        self.assertEqual(self.runs.filter(key="k").count(), 2)

    def test_k2_concurrent_starts_with_one_key_make_one_run(self) -> None:
        """K2: concurrent starts with one key make one run."""
        outcomes = run_together(
            *(lambda: self.runs.start(WORKFLOW, {}, key="raced").id for _ in range(RACERS))
        )
        self.assertTrue(all(error is None for _, error in outcomes), outcomes)
        self.assertEqual(len({value for value, _ in outcomes}), 1)
        self.assertEqual(self.runs.filter(key="raced").count(), 1)

    # -- H: child runs ----------------------------------------------------------------------

    def _parent_and_child(self) -> tuple[uuid.UUID, uuid.UUID]:
        parent = self.start()
        self.runs.finish_pass(parent, 1)
        wait = self.waits.start_child(parent, "kid", WORKFLOW + ".child", {"n": 1})
        assert wait.child_id is not None
        return parent, wait.child_id

    def test_h1_a_childs_end_wakes_its_parent_in_the_same_write(self) -> None:
        """H1: a child's end wakes its parent in the same write."""
        parent, child = self._parent_and_child()
        self.assertEqual(self.waits.start_child(parent, "kid", WORKFLOW + ".child").child_id, child)
        self.assertFalse(self.due_now(parent))
        self.runs.complete(child, {"ok": True})
        self.assertTrue(self.due_now(parent))
        # The worker's fused path: the child's last result and its completion in one write.
        parent, child = self._parent_and_child()
        self.steps.schedule(child, "last", FUNCTION)
        claim = self.steps.claim_for_execution(child, "last", FUNCTION, LEASE)
        assert claim is not None

        lease = Lease.objects.db_manager(self.workflow_database).acquire(
            f"workflow-run:{child}", "conformance", LEASE
        )
        assert lease is not None
        done = self.steps.set_result_completing_run(
            claim.step_id, "r", claim.attempt, output={"ok": 1}, lease=lease
        )
        self.assertTrue(done.completed)
        self.assertTrue(self.due_now(parent))

    def test_h2_a_superseded_attempt_cannot_finish_a_child(self) -> None:
        """H2: a superseded attempt cannot finish a child."""
        parent, child = self._parent_and_child()
        self.steps.schedule(child, "last", FUNCTION, retries=1)
        stale = self.steps.claim_for_execution(child, "last", FUNCTION, LEASE)
        assert stale is not None
        self.steps.filter(pk=stale.step_id).update(lease_expires_at=db_now_plus(-1))
        self.assertIsNotNone(self.steps.claim_for_execution(child, "last", FUNCTION, LEASE))

        lease = Lease.objects.db_manager(self.workflow_database).acquire(
            f"workflow-run:{child}", "conformance", LEASE
        )
        assert lease is not None
        done = self.steps.set_result_completing_run(
            stale.step_id, "stale", stale.attempt, output="stale", lease=lease
        )
        self.assertFalse(done.written or done.completed)
        self.assertEqual(self.runs.get(pk=child).status, RunStatus.RUNNING)
        self.assertFalse(self.due_now(parent))

    def test_h3_cancelling_a_parent_cancels_its_live_descendants(self) -> None:
        """H3: cancelling a parent cancels its live descendants."""
        parent, child = self._parent_and_child()
        grandchild = self.waits.start_child(child, "grandkid", WORKFLOW, {}).child_id
        finished = self.waits.start_child(parent, "done-kid", WORKFLOW, {}).child_id
        assert grandchild is not None and finished is not None
        self.runs.complete(finished, None)
        self.runs.cancel(parent)
        for run_id in (parent, child, grandchild):
            run = self.runs.get(pk=run_id)
            self.assertEqual(
                (run.status, (run.error or {}).get("code")), (RunStatus.CANCELLED, RUN_CANCELLED)
            )
        self.assertEqual(self.runs.get(pk=finished).status, RunStatus.COMPLETED)

    # -- T: step timeouts -------------------------------------------------------------------

    def test_t1_an_attempt_past_its_timeout_is_failed_and_its_late_result_refused(self) -> None:
        """T1: an attempt past its timeout is failed and its late result refused."""
        run_id = self.start()
        self.steps.schedule(run_id, "slow", FUNCTION, retries=1, timeout=30)
        first = self.steps.claim_for_execution(run_id, "slow", FUNCTION, LEASE)
        assert first is not None
        self.assertIsNone(self.steps.claim_due(LEASE), "within its timeout")
        self.steps.filter(pk=first.step_id).update(deadline_at=db_now_plus(-1))
        second = self.steps.claim_due(LEASE)
        assert second is not None
        self.assertEqual(second.attempt, first.attempt + 1)
        history = {entry.attempt: entry for entry in self.steps.history(run_id)}
        self.assertEqual((history[first.attempt].error or {}).get("code"), STEP_TIMED_OUT)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(first.step_id, "late", first.attempt)
        self.steps.set_result(second.step_id, "on time", second.attempt)
        self.assertEqual(self.steps.get(pk=first.step_id).result, "on time")


__all__ = ["WorkflowWaitConformanceTests"]
