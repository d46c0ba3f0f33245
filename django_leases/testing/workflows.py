"""A conformance suite for fenced workflow steps: claim rules C1–C14 and fencing rules F1–F14,
runnable against your own database.

Every fencing scenario has a **stale** attempt — claimed, then its lease lapsed and the step
claimed again — and the **current** attempt that replaced it. The rules (DESIGN §5; the
reference workflow-fencing tests are F1–F10):

* C1–C12 pin ``WorkflowStep.objects.claim_for_execution``: which step states are claimed,
  at which attempt, on which clock, and that exactly one of many concurrent claimers wins;
* C13–C14 pin when a failed attempt's retry is due: ``retry_delay`` seconds after the
  failure on the database clock, multiplied by ``retry_backoff`` for each attempt before,
  never more than ``retry_delay_max``;
* F1–F7 pin the fenced writes (``set_result``, ``set_error``, ``refresh_lease``): a stale
  attempt's write raises :class:`~django_leases.exceptions.WorkflowStepSupersededError` (a
  renewal returns ``False``) and writes nothing — neither the step nor its history — while
  the current attempt's write lands, whatever the order of racing writes;
* F8–F10 pin ``execute_step``: a dispatch superseded while it ran ends quietly whatever its
  step function did (missing, raised, returned): nothing written, the run not suspended;
  F13–F14 pin the same for an ``async def`` step function superseded while it awaited;
* F11–F12 pin what the fence is *not*: lease expiry (a slow worker nobody replaced may still
  finish) — and that an attempt writes its outcome once.

Each test's docstring names its rule. Use it by mixing :class:`WorkflowFencingConformanceTests`
into a ``TransactionTestCase`` (real commits are needed: the race rules use threads, each with
its own connection)::

    # yourproject/tests/test_workflow_conformance.py
    from django.test import TransactionTestCase

    from django_leases.testing import WorkflowFencingConformanceTests


    class WorkflowFencing(WorkflowFencingConformanceTests, TransactionTestCase):
        # The alias your database router sends the workflow models to.
        workflow_database = "default"
        databases = {"default"}

**The harness hook.** :meth:`WorkflowFencingConformanceTests.lapse_step_lease` makes a step's
lease read as lapsed *on the database clock* (``lease_expires_at`` set to database now − 1 s,
computed by the database), as it would once the step's worker died; nothing waits for a real
TTL, so the suite takes seconds. Override it if your deployment stores step leases elsewhere.
It runs on PostgreSQL and on a file-backed SQLite database (WAL, ``"transaction_mode":
"IMMEDIATE"``; not ``:memory:``, which threads cannot share).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from unittest import mock

from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from django_leases.clock import DbNow, db_now_plus
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.testing.base import WorkflowConformanceSuite
from django_leases.workflows import engine
from django_leases.workflows.engine import execute_step
from django_leases.workflows.registry import step_function

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowStep
    from django_leases.workflows.engine import StepContext
    from django_leases.workflows.values import Claim

#: The step every scenario claims, and its step function.
STEP = "charge"
FUNCTION = "charge:card"
#: A step lease that never lapses by itself during a test, seconds.
LEASE = 60.0
#: How many times F6 races a stale and a current write.
RACES = 25
#: How many claimers C12 races.
CLAIMERS = 8

#: Step function the F9/F10 dispatches run; it calls the callback its data names.
TAKEN_WHILE_RUNNING = "django_leases.conformance.taken-while-running"
_callbacks: dict[str, Callable[[StepContext], Any]] = {}


@step_function(TAKEN_WHILE_RUNNING)
def _taken_while_running(data: dict[str, Any], ctx: StepContext) -> Any:
    """Hands the call to the scenario that scheduled it (see ``_dispatch_stale``)."""
    return _callbacks[data["callback"]](ctx)


#: The ``async def`` step function the F13/F14 dispatches run: it awaits, then hands the call
#: to the scenario (through ``sync_to_async``: on the dispatching thread and its connection).
TAKEN_WHILE_AWAITING = "django_leases.conformance.taken-while-awaiting"


@step_function(TAKEN_WHILE_AWAITING)
async def _taken_while_awaiting(data: dict[str, Any], ctx: StepContext) -> Any:
    """Awaits, then hands the call to the scenario that scheduled it (``_dispatch_stale``)."""
    await asyncio.sleep(0)
    outcome = await sync_to_async(_callbacks[data["callback"]])(ctx)
    await asyncio.sleep(0)
    return outcome


def run_together(*calls: Callable[[], Any], timeout: float = 60.0) -> list[tuple[Any, Any]]:
    """Run each call on its own thread (and connection), released together by a barrier.

    Returns ``(value, exception)`` per call, in order. Raises ``AssertionError`` if a thread
    is still running after ``timeout`` seconds (a hang).
    """
    barrier = threading.Barrier(len(calls))
    outcomes: list[tuple[Any, Any]] = [(None, None)] * len(calls)

    def racer(index: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            outcomes[index] = (calls[index](), None)
        except BaseException as exc:
            outcomes[index] = (None, exc)
        finally:
            connections.close_all()  # this thread's own connections

    threads = [threading.Thread(target=racer, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if any(thread.is_alive() for thread in threads):
        raise AssertionError(f"a racer was still running after {timeout:g} s")
    return outcomes


class WorkflowFencingConformanceTests(WorkflowConformanceSuite):
    """Rules C1–C14 and F1–F14 as ``test_*`` methods; mix into ``TransactionTestCase``.

    Class attributes you may override:
        workflow_database: the alias the workflow models live on (``str``).
    """

    # -- the harness ------------------------------------------------------------------------

    def lapse_step_lease(self, run_id: uuid.UUID, step_name: str) -> None:
        """**Harness hook.** Make the step's lease read as lapsed on the database clock, as
        it would once its worker died: ``lease_expires_at`` = database now − 1 s."""
        self.steps.filter(run_id=run_id, step_name=step_name).update(
            lease_expires_at=db_now_plus(-1)
        )

    def start_run(
        self,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        function: str = FUNCTION,
        data: Any = None,
    ) -> uuid.UUID:
        """A running run with one pending step :data:`STEP` (``retries``, ``retry_delay`` in
        seconds, ``retry_backoff`` a factor, ``retry_delay_max`` in seconds or ``None``, as
        ``WorkflowStep.objects.schedule`` takes them); its id."""
        run = self.runs.start("django_leases.conformance", {})
        self.steps.schedule(
            run.id,
            STEP,
            function,
            {"amount": 10} if data is None else data,
            retries=retries,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
        )
        return run.id

    def db_now(self, run_id: uuid.UUID) -> datetime:
        """The database clock's now (a ``datetime``, read with the row of run ``run_id``)."""
        rows = self.runs.filter(pk=run_id).annotate(db_now=DbNow())
        now: datetime = rows.values_list("db_now", flat=True).get()
        return now

    def claim(
        self, run_id: uuid.UUID, function: str = FUNCTION, ttl: float = LEASE
    ) -> Claim | None:
        """Claim the test step of ``run_id`` for ``function`` with a step lease of ``ttl``
        seconds: the :class:`Claim`, or ``None`` when it is not claimable."""
        return self.steps.claim_for_execution(run_id, STEP, function, ttl)

    def supersede(self, run_id: uuid.UUID, function: str = FUNCTION) -> tuple[Claim, Claim]:
        """Claim the step, lose its worker, claim it again: ``(stale, current)``."""
        stale = self.claim(run_id, function)
        self.assertIsNotNone(stale, "the first dispatch did not get the step")
        self.lapse_step_lease(run_id, STEP)
        current = self.claim(run_id, function)
        self.assertIsNotNone(current, "the lapsed step was not claimed again")
        assert stale is not None and current is not None
        self.assertEqual(current.attempt, stale.attempt + 1)
        return stale, current

    def step_of(self, run_id: uuid.UUID) -> WorkflowStep:
        """The test step's row of ``run_id``; raises ``WorkflowStep.DoesNotExist``."""
        return self.steps.get(run_id=run_id, step_name=STEP)

    def lease_is_live(self, run_id: uuid.UUID) -> bool:
        """Whether the test step of ``run_id`` has a live step lease on the database clock
        (``bool``)."""
        return self.steps.filter(
            run_id=run_id, step_name=STEP, lease_expires_at__gt=DbNow()
        ).exists()

    def history_of(self, run_id: uuid.UUID) -> list[tuple[Any, ...]]:
        """``(attempt, status, result, error, finished)`` per attempt row, oldest first."""
        return [
            (e.attempt, e.status, e.result, e.error, e.finished_at is not None)
            for e in self.steps.history(run_id)
        ]

    # -- claim rules C1–C12 -----------------------------------------------------------------

    def test_c01_pending_step_is_claimed_at_its_attempt_with_a_live_lease(self) -> None:
        """C1: pending → running at the same attempt, a live lease, one attempt row."""
        run_id = self.start_run()
        got = self.claim(run_id)
        assert got is not None
        self.assertEqual((got.attempt, got.step_name, got.function_name), (1, STEP, FUNCTION))
        self.assertEqual((got.run_id, got.data), (run_id, {"amount": 10}))
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.attempt), ("running", 1))
        self.assertTrue(self.lease_is_live(run_id))
        self.assertEqual(self.history_of(run_id), [(1, "running", None, None, False)])

    def test_c02_scheduled_step_is_claimed_at_the_same_attempt(self) -> None:
        """C2: scheduled → running at the same attempt (no new attempt number)."""
        run_id = self.start_run()
        self.steps.filter(run_id=run_id).update(status="scheduled", attempt=3)
        got = self.claim(run_id)
        assert got is not None
        self.assertEqual((got.attempt, self.step_of(run_id).attempt), (3, 3))

    def test_c03_succeeded_step_is_never_claimed(self) -> None:
        """C3: succeeded → None, even once its (released) lease reads as lapsed."""
        run_id = self.start_run()
        got = self.claim(run_id)
        assert got is not None
        self.steps.set_result(got.step_id, {"ok": True}, got.attempt)
        self.assertIsNone(self.claim(run_id))
        self.lapse_step_lease(run_id, STEP)
        self.assertIsNone(self.claim(run_id))
        self.assertEqual(self.step_of(run_id).attempt, 1)

    def test_c04_running_step_with_a_live_lease_is_not_claimed_nor_touched(self) -> None:
        """C4: running with a live lease → None; the step and its history are unchanged."""
        run_id = self.start_run()
        self.assertIsNotNone(self.claim(run_id))
        before = self.step_of(run_id)
        self.assertIsNone(self.claim(run_id))
        after = self.step_of(run_id)
        self.assertEqual(
            (after.attempt, after.status, after.lease_expires_at),
            (before.attempt, before.status, before.lease_expires_at),
        )
        self.assertEqual(len(self.history_of(run_id)), 1)

    def test_c05_lapsed_step_is_claimed_as_the_next_attempt(self) -> None:
        """C5: running with a lapsed lease → attempt + 1, a live lease and a new attempt row;
        the superseded attempt's row stays ``running``."""
        run_id = self.start_run()
        stale, current = self.supersede(run_id)
        self.assertEqual((stale.attempt, current.attempt), (1, 2))
        self.assertTrue(self.lease_is_live(run_id))
        self.assertEqual(
            self.history_of(run_id),
            [(1, "running", None, None, False), (2, "running", None, None, False)],
        )

    def test_c06_failed_step_with_attempts_left_is_claimed_after_its_retry_delay(self) -> None:
        """C6: failed with attempts left → attempt + 1 once ``retry_delay`` has passed on the
        database clock; the new attempt starts without the old error."""
        run_id = self.start_run(retries=2, retry_delay=3600)
        first = self.claim(run_id)
        assert first is not None
        self.assertEqual(self.steps.set_error(first.step_id, "declined", 1).status, "failed")
        self.assertIsNone(self.claim(run_id), "claimed before its retry delay passed")
        self.steps.filter(run_id=run_id).update(available_at=db_now_plus(-1))
        second = self.claim(run_id)
        assert second is not None
        self.assertEqual(second.attempt, 2)
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.error), ("running", None))

    def test_c07_failed_step_out_of_attempts_is_not_claimed(self) -> None:
        """C7: failed with no retries left → None; the last error stays."""
        run_id = self.start_run(retries=1)
        for attempt in (1, 2):
            got = self.claim(run_id)
            assert got is not None
            self.assertEqual(got.attempt, attempt)
            self.steps.set_error(got.step_id, f"declined {attempt}", attempt)
        self.assertIsNone(self.claim(run_id))
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.attempt), ("failed", 2))
        self.assertEqual((step.error or {}).get("message"), "declined 2")

    def test_c08_lapsed_step_out_of_attempts_fails_as_having_lost_its_worker(self) -> None:
        """C8: running, lapsed and out of attempts → None, and the step fails with a "lost its
        worker on every attempt" error; the run is asked for a pass (which fails it)."""
        run_id = self.start_run(retries=1)
        requests = self.runs.get(pk=run_id).pass_requests
        _stale, current = self.supersede(run_id)
        self.lapse_step_lease(run_id, STEP)
        self.assertIsNone(self.claim(run_id))
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.attempt, step.lease_expires_at), ("failed", 2, None))
        self.assertIn("lost its worker on every attempt", (step.error or {}).get("message", ""))
        self.assertEqual([h[:2] for h in self.history_of(run_id)], [(1, "running"), (2, "failed")])
        self.assertTrue(self.runs.get(pk=run_id).pass_requests > requests)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(current.step_id, "late", current.attempt)

    def test_c09_a_different_function_name_is_refused_before_any_write(self) -> None:
        """C9: a function name other than the recorded one → a clear ``ValueError`` naming it,
        with nothing written."""
        run_id = self.start_run()
        with self.assertRaisesRegex(ValueError, FUNCTION):
            self.claim(run_id, function="refund:card")
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.lease_expires_at), ("pending", None))
        self.assertEqual(self.history_of(run_id), [])

    def test_c10_steps_of_a_run_that_is_not_running_are_not_claimed(self) -> None:
        """C10: a suspended, failed or cancelled run's steps → None, pending or lapsed."""
        for status in ("suspended", "failed", "cancelled"):
            with self.subTest(status=status):
                run_id = self.start_run()
                self.runs.filter(pk=run_id).update(status=status)
                self.assertIsNone(self.claim(run_id))
                self.runs.filter(pk=run_id).update(status="running")
                self.assertIsNotNone(self.claim(run_id))
                self.lapse_step_lease(run_id, STEP)
                self.runs.filter(pk=run_id).update(status=status)
                self.assertIsNone(self.claim(run_id))
                self.assertEqual(self.step_of(run_id).attempt, 1)

    def test_c11_live_or_lapsed_is_judged_on_the_database_clock(self) -> None:
        """C11: the application's clock plays no part: an hour ahead it lapses nothing, an
        hour behind it keeps nothing alive."""
        run_id = self.start_run()
        self.assertIsNotNone(self.claim(run_id, ttl=600))
        real_now = timezone.now
        with mock.patch.object(timezone, "now", lambda: real_now() + timedelta(hours=1)):
            self.assertIsNone(self.claim(run_id), "an application clock ahead lapsed the lease")
        self.lapse_step_lease(run_id, STEP)
        with mock.patch.object(timezone, "now", lambda: real_now() - timedelta(hours=1)):
            got = self.claim(run_id)
        assert got is not None
        self.assertEqual(got.attempt, 2)

    def test_c12_exactly_one_of_many_concurrent_claimers_wins(self) -> None:
        """C12: eight claimers released together — for a pending, a lapsed and a failed
        step — get exactly one claim, at the right attempt, with one attempt row each."""
        for state, expected in (("pending", 1), ("lapsed", 2), ("failed", 2)):
            with self.subTest(state=state):
                run_id = self.start_run()
                if state != "pending":
                    first = self.claim(run_id)
                    assert first is not None
                    if state == "lapsed":
                        self.lapse_step_lease(run_id, STEP)
                    else:
                        self.steps.set_error(first.step_id, "declined", first.attempt)
                outcomes = run_together(*[lambda run_id=run_id: self.claim(run_id)] * CLAIMERS)
                errors = [error for _, error in outcomes if error is not None]
                self.assertEqual(errors, [])
                winners = [value for value, _ in outcomes if value is not None]
                self.assertEqual(len(winners), 1, f"{len(winners)} claimers won")
                self.assertEqual(winners[0].attempt, expected)
                self.assertEqual(self.step_of(run_id).attempt, expected)
                self.assertEqual(len(self.history_of(run_id)), expected)

    # -- retry delays C13–C14 ---------------------------------------------------------------

    def assert_retry_delays(self, run_id: uuid.UUID, delays: list[float]) -> None:
        """Fail the test step's attempts one after the other (each claimed once its retry is
        due, made due at once on the database clock) and check that the retry after the
        n-th is due ``delays[n - 1]`` seconds after the failure was recorded: between
        database now + delay read just before and just after the write."""
        for attempt, delay in enumerate(delays, start=1):
            got = self.claim(run_id)
            self.assertIsNotNone(got, f"attempt {attempt} was not claimed once due")
            assert got is not None
            self.assertEqual(got.attempt, attempt)
            before = self.db_now(run_id)
            self.steps.set_error(got.step_id, f"declined {attempt}", attempt)
            after = self.db_now(run_id)
            due = self.step_of(run_id).available_at
            assert due is not None
            wait = timedelta(seconds=delay)
            self.assertGreaterEqual(due, before + wait, f"attempt {attempt + 1} due too soon")
            self.assertGreaterEqual(after + wait, due, f"attempt {attempt + 1} due too late")
            if delay:
                self.assertIsNone(self.claim(run_id), "claimed before its retry delay passed")
            self.steps.filter(run_id=run_id).update(available_at=db_now_plus(-1))

    def test_c13_the_retry_delay_grows_by_its_backoff_up_to_its_cap(self) -> None:
        """C13: after attempt n fails, attempt n + 1 is due ``min(retry_delay ×
        retry_backoff^(n − 1), retry_delay_max)`` seconds later on the database clock: with
        10 s, a backoff of 2 and a cap of 30 s, the retries are due 10, 20, then 30 s (not
        40) after each failure."""
        run_id = self.start_run(retries=3, retry_delay=10, retry_backoff=2, retry_delay_max=30)
        self.assert_retry_delays(run_id, [10, 20, 30])
        got = self.claim(run_id)
        assert got is not None
        self.assertEqual(got.attempt, 4)
        self.steps.set_error(got.step_id, "declined 4", 4)
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.available_at), ("failed", None))
        self.assertIsNone(self.claim(run_id), "claimed out of attempts")

    def test_c14_without_a_backoff_every_retry_waits_the_same_delay(self) -> None:
        """C14: the default ``retry_backoff`` of 1 keeps the delay constant: each retry is
        due ``retry_delay`` seconds after its failure; a ``retry_delay_max`` below it caps
        even the first."""
        run_id = self.start_run(retries=3, retry_delay=7)
        self.assert_retry_delays(run_id, [7, 7, 7])
        capped = self.start_run(retries=2, retry_delay=600, retry_delay_max=5)
        self.assert_retry_delays(capped, [5, 5])

    # -- fenced writes F1–F7 ----------------------------------------------------------------

    def test_f01_stale_result_is_refused_and_the_current_result_lands(self) -> None:
        """F1: a stale attempt's result raises ``WorkflowStepSupersededError`` and writes
        nothing (step, history); the current attempt's result lands; one history entry per
        attempt, the superseded one still ``running``."""
        run_id = self.start_run()
        stale, current = self.supersede(run_id)
        history = self.history_of(run_id)
        with self.assertRaises(WorkflowStepSupersededError) as refused:
            self.steps.set_result(stale.step_id, "stale", stale.attempt)
        self.assertEqual(
            (refused.exception.attempt, refused.exception.current_attempt),
            (stale.attempt, current.attempt),
        )
        self.assertEqual(self.history_of(run_id), history, "the refused write touched history")
        self.steps.set_result(current.step_id, "fresh", current.attempt)
        step = self.step_of(run_id)
        self.assertEqual(
            (step.status, step.result, step.attempt, step.lease_expires_at),
            ("succeeded", "fresh", current.attempt, None),
        )
        self.assertEqual(
            self.history_of(run_id),
            [(1, "running", None, None, False), (2, "succeeded", "fresh", None, True)],
        )

    def test_f02_stale_error_is_refused_and_does_not_fail_the_step(self) -> None:
        """F2: a stale attempt's error is refused; the step stays running under the current
        attempt, with no error, and the history is unchanged."""
        run_id = self.start_run()
        stale, current = self.supersede(run_id)
        history = self.history_of(run_id)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_error(stale.step_id, RuntimeError("stale"), stale.attempt)
        step = self.step_of(run_id)
        self.assertEqual(
            (step.status, step.error, step.attempt), ("running", None, current.attempt)
        )
        self.assertEqual(self.history_of(run_id), history)

    def test_f03_stale_attempt_can_neither_renew_nor_release_the_current_lease(self) -> None:
        """F3: a stale renewal or release returns ``False`` and leaves the current lease
        exactly as it was; the current attempt's renewal and release land."""
        run_id = self.start_run()
        stale, current = self.supersede(run_id)
        held = self.step_of(run_id).lease_expires_at
        self.assertFalse(self.steps.refresh_lease(stale.step_id, 10 * LEASE, stale.attempt))
        self.assertEqual(self.step_of(run_id).lease_expires_at, held, "the stale renewal landed")
        self.assertFalse(self.steps.refresh_lease(stale.step_id, None, stale.attempt))
        self.assertEqual(self.step_of(run_id).lease_expires_at, held, "the stale release landed")
        self.assertTrue(self.steps.refresh_lease(current.step_id, 10 * LEASE, current.attempt))
        self.assertTrue(
            self.steps.filter(
                pk=current.step_id, lease_expires_at__gt=db_now_plus(5 * LEASE)
            ).exists()
        )
        self.assertTrue(self.steps.refresh_lease(current.step_id, None, current.attempt))
        self.assertIsNone(self.step_of(run_id).lease_expires_at)

    def test_f04_stale_attempt_cannot_overwrite_a_step_the_current_one_succeeded(self) -> None:
        """F4: after the current attempt succeeded, a stale result or error is refused."""
        run_id = self.start_run()
        stale, current = self.supersede(run_id)
        self.steps.set_result(current.step_id, "fresh", current.attempt)
        history = self.history_of(run_id)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(stale.step_id, "stale", stale.attempt)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_error(stale.step_id, RuntimeError("stale"), stale.attempt)
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.result, step.error), ("succeeded", "fresh", None))
        self.assertEqual(self.history_of(run_id), history)

    def test_f05_stale_attempt_cannot_overwrite_a_step_the_current_one_failed(self) -> None:
        """F5: after the current attempt failed, a stale result is refused."""
        run_id = self.start_run()
        stale, current = self.supersede(run_id)
        self.steps.set_error(current.step_id, RuntimeError("fresh"), current.attempt)
        history = self.history_of(run_id)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(stale.step_id, "stale", stale.attempt)
        step = self.step_of(run_id)
        self.assertEqual(step.status, "failed")
        self.assertEqual(step.error, {"type": "RuntimeError", "message": "fresh"})
        self.assertIsNone(step.result)
        self.assertEqual(self.history_of(run_id), history)

    def test_f06_racing_stale_and_current_writes_only_the_current_ever_lands(self) -> None:
        """F6: a stale write (result or error) and the current result, released together 25
        times in varying order: the stale one is always refused and writes nothing, the
        current one always lands (step and history)."""
        for i in range(RACES):
            run_id = self.start_run()
            stale, current = self.supersede(run_id)

            def stale_write(stale: Claim = stale, i: int = i) -> None:
                if i % 2 == 0:
                    self.steps.set_result(stale.step_id, "stale", stale.attempt)
                else:
                    self.steps.set_error(stale.step_id, RuntimeError("stale"), stale.attempt)

            def current_write(current: Claim = current) -> None:
                self.steps.set_result(current.step_id, "fresh", current.attempt)

            if i % 3:
                (_, stale_error), (_, current_error) = run_together(stale_write, current_write)
            else:
                (_, current_error), (_, stale_error) = run_together(current_write, stale_write)
            self.assertIsInstance(stale_error, WorkflowStepSupersededError, f"race {i}")
            self.assertIsNone(current_error, f"race {i}")
            step = self.step_of(run_id)
            self.assertEqual(
                (step.status, step.result, step.error), ("succeeded", "fresh", None), f"race {i}"
            )
            self.assertEqual(
                self.history_of(run_id),
                [(1, "running", None, None, False), (2, "succeeded", "fresh", None, True)],
                f"race {i}",
            )

    def test_f07_a_third_claim_fences_out_both_attempts_before_it(self) -> None:
        """F7: once a third claim replaced the second, neither earlier attempt can record a
        result or an error or renew the lease; the third attempt's result lands."""
        run_id = self.start_run()
        first, second = self.supersede(run_id)
        self.lapse_step_lease(run_id, STEP)
        third = self.claim(run_id)
        assert third is not None
        self.assertEqual(third.attempt, 3)
        held = self.step_of(run_id).lease_expires_at
        for stale in (first, second):
            with self.assertRaises(WorkflowStepSupersededError):
                self.steps.set_result(stale.step_id, "stale", stale.attempt)
            with self.assertRaises(WorkflowStepSupersededError):
                self.steps.set_error(stale.step_id, "stale", stale.attempt)
            self.assertFalse(self.steps.refresh_lease(stale.step_id, 10 * LEASE, stale.attempt))
        self.assertEqual(self.step_of(run_id).lease_expires_at, held)
        self.steps.set_result(third.step_id, "third", third.attempt)
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.result), ("succeeded", "third"))
        self.assertEqual(
            [h[:2] for h in self.history_of(run_id)],
            [(1, "running"), (2, "running"), (3, "succeeded")],
        )

    # -- superseded dispatches F8–F10 -------------------------------------------------------

    @contextmanager
    def _callback(self, callback: Callable[[StepContext], Any]) -> Iterator[str]:
        key = uuid.uuid4().hex
        _callbacks[key] = callback
        try:
            yield key
        finally:
            _callbacks.pop(key, None)

    def _assert_left_to_the_new_owner(self, run_id: uuid.UUID, current: Claim) -> None:
        step = self.step_of(run_id)
        self.assertEqual(step.status, "running", "the stale attempt finished the step")
        self.assertEqual((step.result, step.error, step.attempt), (None, None, current.attempt))
        run = self.runs.get(pk=run_id)
        self.assertEqual(
            (run.status, run.error), ("running", None), "the stale attempt moved the run"
        )
        self.assertEqual(
            self.history_of(run_id),
            [(1, "running", None, None, False), (2, "running", None, None, False)],
        )

    def _dispatch_stale(
        self, outcome: Callable[[], Any], function: str = TAKEN_WHILE_RUNNING
    ) -> None:
        """Dispatch the step through ``execute_step`` with a step function (``function``)
        that loses the step to a newer claim while it runs and then does ``outcome``; check
        it ended quietly."""
        taken: list[Claim] = []

        def lose_the_step_then(ctx: StepContext) -> Any:
            self.lapse_step_lease(ctx.run_id, ctx.step_name)
            newer = self.steps.claim_for_execution(ctx.run_id, ctx.step_name, function, LEASE)
            assert newer is not None, "the step was not claimed from under the worker"
            taken.append(newer)
            return outcome()

        with self._callback(lose_the_step_then) as key:
            run_id = self.start_run(function=function, data={"callback": key})
            stale = self.claim(run_id, function)
            assert stale is not None
            stale = _on(stale, self.workflow_database)
            with self.assertLogs("django_leases.workflows", "WARNING") as logs:
                self.assertEqual(execute_step(stale), "superseded")
        self.assertTrue(taken, "the step was never claimed from under the worker")
        self._assert_left_to_the_new_owner(run_id, taken[0])
        self.assertTrue(any("superseded" in line for line in logs.output))

    def test_f08_a_superseded_dispatch_whose_function_is_missing_does_not_suspend(self) -> None:
        """F8: the step function is missing, but the attempt was superseded meanwhile: the
        step is not failed, the run is not suspended, and the dispatch ends quietly."""
        missing = "django_leases.conformance.not-registered"
        run_id = self.start_run(function=missing)
        stale = self.claim(run_id, missing)
        assert stale is not None
        taken: list[Claim] = []
        real_lookup = engine.get_step_function

        def lookup_while_losing_the_step(name: str) -> Callable[..., Any] | None:
            self.lapse_step_lease(run_id, STEP)
            newer = self.claim(run_id, missing)
            assert newer is not None
            taken.append(newer)
            return real_lookup(name)

        with (
            mock.patch.object(engine, "get_step_function", lookup_while_losing_the_step),
            self.assertLogs("django_leases.workflows", "WARNING") as logs,
        ):
            self.assertEqual(engine.execute_step(_on(stale, self.workflow_database)), "superseded")
        self.assertTrue(taken)
        self._assert_left_to_the_new_owner(run_id, taken[0])
        self.assertTrue(any("superseded" in line for line in logs.output))

    def test_f09_a_superseded_dispatch_whose_function_raises_ends_quietly(self) -> None:
        """F9: the function raised after its attempt was superseded: no error recorded, the
        step left to its new owner, nothing raised."""

        def declined() -> Any:
            raise RuntimeError("the card was declined")

        self._dispatch_stale(declined)

    def test_f10_a_superseded_dispatch_whose_function_succeeds_records_nothing(self) -> None:
        """F10: the function returned after its attempt was superseded: its result is not
        recorded and the step stays with its new owner."""
        self._dispatch_stale(lambda: "stale")

    def test_f13_a_superseded_async_dispatch_records_nothing(self) -> None:
        """F13: an ``async def`` step function returned after its attempt was superseded while
        it awaited: its result is refused like a sync one's, the step stays with its new
        owner, and the dispatch ends quietly."""
        self._dispatch_stale(lambda: "stale", TAKEN_WHILE_AWAITING)

    def test_f14_a_superseded_async_dispatch_that_raises_ends_quietly(self) -> None:
        """F14: an ``async def`` step function raised after its attempt was superseded: no
        error recorded, the step left to its new owner, nothing raised."""

        def declined() -> Any:
            raise RuntimeError("the card was declined")

        self._dispatch_stale(declined, TAKEN_WHILE_AWAITING)

    # -- what the fence is not F11–F12 ------------------------------------------------------

    def test_f11_a_slow_worker_nobody_replaced_may_still_finish(self) -> None:
        """F11: the fence is the attempt, not lease expiry: with its lease lapsed but no newer
        claim, the attempt's result still lands."""
        run_id = self.start_run()
        got = self.claim(run_id)
        assert got is not None
        self.lapse_step_lease(run_id, STEP)
        self.steps.set_result(got.step_id, "late but alone", got.attempt)
        step = self.step_of(run_id)
        self.assertEqual((step.status, step.result), ("succeeded", "late but alone"))

    def test_f12_an_attempt_records_one_outcome(self) -> None:
        """F12: once the current attempt recorded its result, a different outcome from the same
        attempt is refused and the first stays."""
        run_id = self.start_run()
        got = self.claim(run_id)
        assert got is not None
        self.steps.set_result(got.step_id, 1, got.attempt)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_result(got.step_id, 2, got.attempt)
        with self.assertRaises(WorkflowStepSupersededError):
            self.steps.set_error(got.step_id, "late", got.attempt)
        self.assertEqual(self.step_of(run_id).result, 1)


def _on(claim: Claim, alias: str) -> Claim:
    """``claim`` as made on ``alias`` (claims carry their alias; this asserts it)."""
    assert claim.using == alias, (claim.using, alias)
    return claim


__all__ = [
    "TAKEN_WHILE_AWAITING",
    "TAKEN_WHILE_RUNNING",
    "WorkflowFencingConformanceTests",
    "run_together",
]
