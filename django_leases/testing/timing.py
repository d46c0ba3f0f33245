"""A conformance suite for delayed starts, debounced starts and run deadlines (DESIGN §5c),
runnable against your own database.

The rules, pinned on ``WorkflowRun.objects`` (what ``start_workflow``, ``run.child``, the
worker and ``drive()`` call):

* S1–S3 — delayed starts (``start(..., run_after=)``): the first pass is not due before
  the given time on the database clock (seconds, or an aware ``datetime``); bad or
  unmatched timing options are refused with nothing written;
* B1–B3 — debounced starts (``debounce_key`` + ``debounce``): a start while the key's run
  is pending replaces its input and moves its first pass; once its first pass has been
  picked, a start makes a new pending run; concurrent starts make one run; a start racing
  the pick of the pending run's first pass either moves it (and the pick finds nothing)
  or finds it picked (and makes a new run) — never both, never neither;
* D1–D5 — deadlines (``deadline``): a live run past its deadline is failed with
  ``WorkflowDeadlineExceeded`` and its live descendants cancelled, nothing else touched;
  its running attempt is superseded (a late result refused, nothing written); a child's
  deadline is the earlier of its own and its parent's; the expiry racing a completion
  that carries a step's result, or an event, lets exactly one outcome win.

Mix :class:`WorkflowTimingConformanceTests` into a ``TransactionTestCase`` (the races use
threads, each with its own connection)::

    from django.test import TransactionTestCase

    from django_leases.testing.timing import WorkflowTimingConformanceTests


    class WorkflowTiming(WorkflowTimingConformanceTests, TransactionTestCase):
        workflow_database = "default"
        databases = {"default"}

Time is never waited for: a deadline or a first pass is made to have passed by moving it a
second into the past on the database clock (:meth:`pass_deadline`, :meth:`pass_first_pass`,
the harness hooks).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.utils import timezone

from django_leases.clock import DbNow, db_now_plus
from django_leases.exceptions import (
    WorkflowEventRefusedError,
    WorkflowRunStateError,
    WorkflowStepSupersededError,
)
from django_leases.models import WorkflowWait
from django_leases.testing.base import WorkflowConformanceSuite
from django_leases.testing.workflows import run_together
from django_leases.workflows.values import (
    RUN_CANCELLED,
    AttemptStatus,
    Claim,
    PendingResult,
    RunStatus,
    StepStatus,
    WaitKind,
    WaitStatus,
)

if TYPE_CHECKING:
    from django_leases.models.wait import WorkflowWaitQuerySet

#: The workflow name the suite's runs carry (never registered: no pass is run).
WORKFLOW = "django_leases.conformance.timing"
FUNCTION = "django_leases.conformance.work"
LEASE = 60.0
#: How many starters B2 races.
RACERS = 8
#: The error type a run past its deadline records.
DEADLINE_ERROR = "WorkflowDeadlineExceeded"


class WorkflowTimingConformanceTests(WorkflowConformanceSuite):
    """Rules S1–S3, B1–B3 and D1–D5 as ``test_*`` methods; mix into
    ``TransactionTestCase``. Override :attr:`workflow_database` for another alias."""

    # -- the harness ------------------------------------------------------------------------

    def pass_deadline(self, run_id: uuid.UUID) -> None:
        """**Harness hook.** Make run ``run_id``'s deadline a second ago on the database
        clock."""
        self.runs.filter(pk=run_id).update(deadline_at=db_now_plus(-1))

    def _claimed_past_deadline(self, step_name: str, *, retries: int) -> tuple[uuid.UUID, Claim]:
        """Start a run with a deadline, claim its step ``step_name`` (``retries`` retries)
        for execution, then pass the deadline; the run's id and the step's claim."""
        run_id = self.start(deadline=3600)
        self.steps.schedule(run_id, step_name, FUNCTION, retries=retries)
        claim = self.steps.claim_for_execution(run_id, step_name, FUNCTION, LEASE)
        assert claim is not None
        self.pass_deadline(run_id)
        return run_id, claim

    def pass_first_pass(self, run_id: uuid.UUID) -> None:
        """**Harness hook.** Make a pending run's first pass due a second ago (still
        pending), as its delay or debounce window had passed."""
        self.runs.filter(pk=run_id).update(
            pass_due_at=db_now_plus(-1), first_pass_at=db_now_plus(-1)
        )

    @property
    def waits(self) -> WorkflowWaitQuerySet:
        """``WorkflowWait`` rows on :attr:`workflow_database` (a ``WorkflowWaitQuerySet``)."""
        return WorkflowWait.objects.db_manager(self.workflow_database).all()

    def start(self, input: Any = None, **options: Any) -> uuid.UUID:
        """Start a run of the suite's workflow (``options`` go to ``start``); its id."""
        return self.runs.start(WORKFLOW, {} if input is None else input, **options).id

    def due_now(self, run_id: uuid.UUID) -> bool:
        """Whether run ``run_id``'s next pass is due now on the database clock (``bool``)."""
        return self.runs.filter(pk=run_id, pass_due_at__lte=DbNow()).exists()

    def pick(self) -> uuid.UUID | None:
        """Pick the due pass (as a worker does); its run id, or ``None``."""
        claim = self.runs.claim_due_pass(LEASE, lease_holder=f"conformance-{uuid.uuid4()}")
        return None if claim is None else claim.run_id

    def assert_failed_at_deadline(self, run_id: uuid.UUID) -> None:
        """Run ``run_id`` is failed with the deadline's error type."""
        run = self.runs.get(pk=run_id)
        self.assertEqual(
            (run.status, (run.error or {}).get("type")), (RunStatus.FAILED, DEADLINE_ERROR)
        )
        self.assertIsNone(run.pass_due_at)
        self.assertIsNotNone(run.finished_at)

    # -- S: delayed starts ------------------------------------------------------------------

    def test_s1_a_delayed_first_pass_is_not_due_before_its_time(self) -> None:
        """S1: a delayed first pass is not due before its time (database clock)."""
        for after in (3600, timedelta(hours=1)):
            with self.subTest(after=after):
                run_id = self.start(run_after=after)
                ahead = self.runs.filter(
                    pk=run_id, pass_due_at__gt=db_now_plus(3590), pass_due_at__lte=db_now_plus(3600)
                )
                self.assertTrue(ahead.exists())
                self.assertIsNone(self.pick(), "not due yet")
                self.assertTrue(self.runs.pending().filter(pk=run_id).exists())
                self.pass_first_pass(run_id)
                self.assertEqual(self.pick(), run_id)
                self.assertFalse(self.runs.pending().filter(pk=run_id).exists())
        now = self.start(run_after=0)
        self.assertEqual(self.pick(), now, "0 s: due at once")

    def test_s2_a_datetime_is_a_point_in_time(self) -> None:
        """S2: an aware datetime is a point in time; a past one is due at once; a naive one
        is refused while USE_TZ is on."""
        past = self.start(run_after=timezone.now() - timedelta(days=1))
        self.assertEqual(self.pick(), past)
        later = self.start(run_after=timezone.now() + timedelta(days=1))
        self.assertTrue(self.runs.filter(pk=later, pass_due_at__gt=db_now_plus(86000)).exists())
        self.assertIsNone(self.pick())
        if django_settings.USE_TZ:
            with self.assertRaisesRegex(ValueError, "aware"):
                self.start(run_after=datetime(2030, 1, 1))
            self.assertEqual(self.runs.count(), 2, "nothing written")

    def test_s3_bad_timing_options_are_refused_with_nothing_written(self) -> None:
        """S3: bad or unmatched timing options are ValueError with nothing written."""
        bad: list[dict[str, Any]] = [
            {"run_after": -1},
            {"run_after": math.nan},
            {"run_after": math.inf},
            {"run_after": True},
            {"run_after": "10"},
            {"deadline": 0},
            {"deadline": -5},
            {"deadline": math.nan},
            {"deadline": timedelta(0)},
            {"debounce": 5},
            {"debounce_key": "k"},
            {"debounce_key": "k", "debounce": 0},
            {"debounce_key": "k", "debounce": -1},
            {"debounce_key": "k", "debounce": math.nan},
            {"debounce_key": "", "debounce": 5},
            {"debounce_key": "x" * 256, "debounce": 5},
            {"debounce_key": 7, "debounce": 5},
            {"debounce_key": "k", "debounce": 5, "key": "k"},
            {"debounce_key": "k", "debounce": 5, "run_after": 5},
            {"debounce_key": "k", "debounce": 5, "parent": uuid.uuid4()},
        ]
        for options in bad:
            with self.subTest(options=options), self.assertRaises(ValueError):
                self.start(**options)
        self.assertFalse(self.runs.exists(), "nothing written")

    # -- B: debounced starts ----------------------------------------------------------------

    def test_b1_a_start_while_pending_replaces_the_input_and_moves_the_first_pass(self) -> None:
        """B1: a start while the key's run is pending replaces its input and moves its first
        pass; once that pass was picked, a start makes a new pending run."""
        first = self.runs.start(WORKFLOW, {"n": 1}, debounce_key="k", debounce=30)
        self.assertTrue(first.started)
        self.assertIsNone(self.pick(), "the window is open")
        again = self.runs.start(WORKFLOW, {"n": 2}, debounce_key="k", debounce=3600)
        self.assertEqual((again.pk, again.started), (first.pk, False))
        run = self.runs.get(pk=first.pk)
        self.assertEqual(run.input, {"n": 2})
        moved = self.runs.filter(pk=first.pk, pass_due_at__gt=db_now_plus(3590))
        self.assertTrue(moved.exists(), "moved to now + the latest debounce")
        other = self.runs.start(WORKFLOW, {}, debounce_key="other", debounce=30).pk
        self.assertNotEqual(other, first.pk, "keys are separate")
        self.pass_first_pass(first.pk)
        self.assertEqual(self.pick(), first.pk)
        fresh = self.runs.start(WORKFLOW, {"n": 3}, debounce_key="k", debounce=30)
        self.assertTrue(fresh.started)
        self.assertNotEqual(fresh.pk, first.pk)
        self.assertEqual(self.runs.get(pk=first.pk).input, {"n": 2}, "the picked run is kept")
        self.assertEqual(self.runs.filter(debounce_key="k").count(), 1)

    def test_b2_concurrent_debounced_starts_make_one_run(self) -> None:
        """B2: concurrent debounced starts of one workflow and key make one run."""

        def start(n: int) -> uuid.UUID:
            return self.start({"n": n}, debounce_key="raced", debounce=3600)

        outcomes = run_together(*(lambda n=n: start(n) for n in range(RACERS)))
        errors = [error for _, error in outcomes if error is not None]
        self.assertEqual(errors, [])
        self.assertEqual(len({value for value, _ in outcomes}), 1)
        self.assertEqual(self.runs.count(), 1)
        self.assertIn(self.runs.get().input["n"], range(RACERS))

    def test_b3_a_start_racing_the_first_pick_either_moves_it_or_starts_afresh(self) -> None:
        """B3: a debounced start racing the pick of the pending run's first pass: either the
        start moved the run (the pick found nothing) or the pick took it (the start made a
        new run)."""
        for turn in range(5):
            with self.subTest(turn=turn):
                self.runs.all().delete()
                first = self.start({"n": 1}, debounce_key="k", debounce=30)
                self.pass_first_pass(first)
                (picked, error1), (started, error2) = run_together(
                    self.pick, lambda: self.start({"n": 2}, debounce_key="k", debounce=3600)
                )
                self.assertEqual((error1, error2), (None, None))
                if picked == first:
                    self.assertNotEqual(started, first)
                    self.assertEqual(self.runs.get(pk=first).input, {"n": 1})
                    self.assertEqual(self.runs.count(), 2)
                else:
                    self.assertIsNone(picked)
                    self.assertEqual(started, first)
                    self.assertEqual(self.runs.get(pk=first).input, {"n": 2})
                    self.assertEqual(self.runs.count(), 1)
                self.assertEqual(self.runs.filter(debounce_key="k").count(), 1)

    # -- D: deadlines -----------------------------------------------------------------------

    def test_d1_a_live_run_past_its_deadline_is_failed_with_its_descendants_cancelled(
        self,
    ) -> None:
        """D1: a live run past its deadline is failed; its live descendants are cancelled;
        runs before their deadline, without one, or finished are not touched."""
        run_id = self.start(deadline=3600)
        ahead = self.runs.filter(
            pk=run_id, deadline_at__gt=db_now_plus(3590), deadline_at__lte=db_now_plus(3600)
        )
        self.assertTrue(ahead.exists())
        child = self.waits.start_child(run_id, "kid", WORKFLOW, {}).child_id
        assert child is not None
        grandchild = self.waits.start_child(child, "grandkid", WORKFLOW, {}).child_id
        done = self.waits.start_child(run_id, "done-kid", WORKFLOW, {}).child_id
        assert grandchild is not None and done is not None
        self.runs.complete(done, None)
        self.runs.finish_pass(run_id, 1)
        self.waits.reach(run_id, "go", WaitKind.EVENT)
        untouched = [self.start(), self.start(deadline=3600)]
        finished = self.start(deadline=3600)
        self.runs.complete(finished, {"ok": True})
        self.pass_deadline(finished)
        self.assertEqual(self.runs.expire_deadlines(), [], "none past its deadline")
        self.pass_deadline(run_id)
        self.assertEqual(self.runs.expire_deadlines(), [run_id])
        self.assert_failed_at_deadline(run_id)
        for descendant in (child, grandchild):
            run = self.runs.get(pk=descendant)
            self.assertEqual(
                (run.status, (run.error or {}).get("code")), (RunStatus.CANCELLED, RUN_CANCELLED)
            )
        self.assertEqual(self.runs.get(pk=done).status, RunStatus.COMPLETED)
        self.assertEqual(self.runs.get(pk=finished).status, RunStatus.COMPLETED)
        for other in untouched:
            self.assertEqual(self.runs.get(pk=other).status, RunStatus.RUNNING)
        with self.assertRaises(WorkflowRunStateError):
            self.waits.send_event(run_id, "go", {})
        self.assertEqual(self.runs.expire_deadlines(), [], "once")

    def test_d2_a_running_attempt_is_superseded_and_its_late_result_refused(self) -> None:
        """D2: the run's running attempt is failed through its fence: its late result is
        refused with nothing written; its waiting steps are no longer due."""
        run_id = self.start(deadline=3600)
        self.steps.schedule(run_id, "slow", FUNCTION, retries=3)
        self.steps.schedule(run_id, "later", FUNCTION, retries=3)
        claim = self.steps.claim_for_execution(run_id, "slow", FUNCTION, LEASE)
        assert claim is not None
        self.pass_deadline(run_id)
        self.assertEqual(self.runs.expire_deadlines(), [run_id])
        self.assert_failed_at_deadline(run_id)
        before = list(self.steps.filter(run_id=run_id).order_by("id").values())
        history = [(e.attempt, e.status, e.result) for e in self.steps.history(run_id)]
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(claim.step_id, "late", claim.attempt)
        self.assertFalse(self.steps.refresh_lease(claim.step_id, LEASE, claim.attempt))
        self.assertEqual(list(self.steps.filter(run_id=run_id).order_by("id").values()), before)
        self.assertEqual(
            [(e.attempt, e.status, e.result) for e in self.steps.history(run_id)], history
        )
        slow = self.steps.get(pk=claim.step_id)
        self.assertEqual(
            (slow.status, (slow.error or {}).get("type")), (StepStatus.FAILED, DEADLINE_ERROR)
        )
        self.assertEqual(history, [(claim.attempt, AttemptStatus.FAILED, None)])
        self.assertIsNone(self.steps.claim_due(LEASE), "nothing of the run is due any more")

    def test_d3_a_childs_deadline_is_the_earlier_of_its_own_and_its_parents(self) -> None:
        """D3: a child's deadline is the earlier of its own and its parent's; without one of
        its own it has its parent's; a parent without one leaves the child's own."""
        parent = self.start(deadline=3600)
        deadline = self.runs.get(pk=parent).deadline_at
        cases = {"inherits": None, "earlier": 60, "later": 7200}
        kids: dict[str, uuid.UUID] = {}
        for name, own in cases.items():
            kid = self.waits.start_child(parent, name, WORKFLOW, {}, deadline=own).child_id
            assert kid is not None
            kids[name] = kid
        self.assertEqual(self.runs.get(pk=kids["inherits"]).deadline_at, deadline)
        self.assertEqual(self.runs.get(pk=kids["later"]).deadline_at, deadline)
        earlier = self.runs.filter(pk=kids["earlier"], deadline_at__lte=db_now_plus(60))
        self.assertTrue(earlier.exists())
        free = self.start()
        alone = self.waits.start_child(free, "kid", WORKFLOW, {}, deadline=60).child_id
        self.assertTrue(self.runs.filter(pk=alone, deadline_at__lte=db_now_plus(60)).exists())
        none = self.waits.start_child(free, "none", WORKFLOW, {}).child_id
        self.assertIsNone(self.runs.get(pk=none).deadline_at)
        self.pass_deadline(kids["earlier"])
        self.assertEqual(self.runs.expire_deadlines(), [kids["earlier"]])
        self.assertEqual(self.runs.get(pk=parent).status, RunStatus.RUNNING)
        self.assertTrue(self.due_now(parent), "the failed child asks its parent for a pass")

    def test_d4_the_deadline_racing_a_completion_carrying_a_steps_result(self) -> None:
        """D4: the expiry racing the write that carries a step's result and completes the
        run: exactly one wins, the other writes nothing."""
        for turn in range(5):
            with self.subTest(turn=turn):
                run_id, claim = self._claimed_past_deadline("last", retries=0)
                pending = PendingResult(claim.step_id, claim.attempt, {"r": turn})
                (expired, error1), (completed, error2) = run_together(
                    self.runs.expire_deadlines,
                    partial(self.runs.complete, run_id, {"done": turn}, pending=pending),
                )
                self.assertIsNone(error1)
                run = self.runs.get(pk=run_id)
                step = self.steps.get(pk=claim.step_id)
                [entry] = self.steps.history(run_id)
                if run.status == RunStatus.COMPLETED:
                    self.assertEqual((expired, error2, completed), ([], None, True))
                    self.assertEqual(run.output, {"done": turn})
                    self.assertEqual(
                        (step.status, step.result), (StepStatus.SUCCEEDED, {"r": turn})
                    )
                    self.assertEqual(entry.status, AttemptStatus.SUCCEEDED)
                else:
                    self.assertEqual(expired, [run_id])
                    self.assertIsInstance(error2, WorkflowStepSupersededError)
                    self.assert_failed_at_deadline(run_id)
                    self.assertIsNone(run.output)
                    self.assertEqual((step.status, step.result), (StepStatus.FAILED, None))
                    self.assertEqual((entry.status, entry.result), (AttemptStatus.FAILED, None))

    def test_d4_the_deadline_racing_a_steps_own_result_write(self) -> None:
        """D4 (the step's own write): the expiry racing ``set_result`` of the running
        attempt: the result lands whole before the expiry (and the run still fails at its
        deadline), or it is refused with nothing written."""
        for turn in range(5):
            with self.subTest(turn=turn):
                run_id, claim = self._claimed_past_deadline("step", retries=2)
                (expired, error1), (_, error2) = run_together(
                    self.runs.expire_deadlines,
                    partial(self.steps.set_result, claim.step_id, {"r": turn}, claim.attempt),
                )
                self.assertEqual((expired, error1), ([run_id], None))
                self.assert_failed_at_deadline(run_id)
                step = self.steps.get(pk=claim.step_id)
                [entry] = self.steps.history(run_id)
                if error2 is None:
                    self.assertEqual(
                        (step.status, step.result), (StepStatus.SUCCEEDED, {"r": turn})
                    )
                    self.assertEqual(
                        (entry.status, entry.result), (AttemptStatus.SUCCEEDED, {"r": turn})
                    )
                else:
                    self.assertIsInstance(error2, WorkflowStepSupersededError)
                    self.assertEqual((step.status, step.result), (StepStatus.FAILED, None))
                    self.assertEqual((entry.status, entry.result), (AttemptStatus.FAILED, None))

    def test_d5_the_deadline_racing_an_event(self) -> None:
        """D5: the expiry racing an event for the run's wait: the run ends failed at its
        deadline either way; the event is either delivered whole (before the expiry) or
        refused with nothing stored."""
        for turn in range(5):
            with self.subTest(turn=turn):
                run_id = self.start(deadline=3600)
                self.runs.finish_pass(run_id, 1)
                self.waits.reach(run_id, "go", WaitKind.EVENT)
                self.pass_deadline(run_id)
                (expired, error1), (_, error2) = run_together(
                    self.runs.expire_deadlines,
                    partial(self.waits.send_event, run_id, "go", {"turn": turn}),
                )
                self.assertIsNone(error1)
                self.assertEqual(expired, [run_id])
                self.assert_failed_at_deadline(run_id)
                wait = self.waits.get(run_id=run_id, name="go")
                if error2 is None:
                    self.assertEqual((wait.status, wait.payload), (WaitStatus.DONE, {"turn": turn}))
                else:
                    self.assertIsInstance(error2, WorkflowRunStateError)
                    self.assertEqual((wait.status, wait.payload), (WaitStatus.WAITING, None))
                self.assertNotIsInstance(error2, WorkflowEventRefusedError)


__all__ = ["WorkflowTimingConformanceTests"]
