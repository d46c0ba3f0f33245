"""A conformance suite for per-key queue limits and fair claims (DESIGN §5c): rules Q1–Q9.

A queue of ``DJANGO_LEASES["QUEUES"]`` with ``key_concurrency`` and/or ``key_rate`` is
**keyed**: each step counts under its queue key (``start_workflow(queue_key=)``, or
``run.step(queue_key=)``), and among due steps of one priority the keys are served
round-robin — the key claimed least recently goes first — so one key's backlog never
starves another. The rules:

* Q1–Q2 pin the arguments: a bad ``queue_key`` is a ``ValueError`` with nothing written;
  bad ``key_concurrency`` / ``key_rate`` settings are clear errors;
* Q3–Q4 pin ``key_concurrency``: at most N running steps of one key (live leases on the
  database clock), other keys still claimed, and a slot freed when a step's lease lapses;
  the queue-wide ``concurrency`` holds as well;
* Q5 pins ``key_rate``: at most N starts of one key in the window;
* Q6–Q7 pin round-robin: a key queued after another's backlog is served at once, and keys
  alternate; higher priority still goes first;
* Q8 pins a step a pass runs inline: it waits its key's turn;
* Q9 pins that a run's ``queue_key`` reaches its steps and ``run.step(queue_key=)``
  overrides it.

Mix :class:`QueueFairnessConformanceTests` into a ``TransactionTestCase``::

    from django.test import TransactionTestCase

    from django_leases.testing.fairness import QueueFairnessConformanceTests


    class QueueFairness(QueueFairnessConformanceTests, TransactionTestCase):
        workflow_database = "default"
        databases = {"default"}

The suite configures its own queues (``fair-*``) and step functions for each test. A lease
is made to read as lapsed on the database clock (:meth:`lapse_step_lease`), never by waiting.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.test import override_settings

from django_leases.clock import db_now_plus
from django_leases.conf import queue_limits
from django_leases.exceptions import QueueConfigError
from django_leases.testing.base import WorkflowConformanceSuite
from django_leases.testing.driving import drive
from django_leases.workflows import registry
from django_leases.workflows.engine import execute_step, start_workflow
from django_leases.workflows.registry import step_function, workflow
from django_leases.workflows.values import NextStep, StepOptions

#: A step lease that never lapses by itself during a test, seconds.
LEASE = 60.0

#: The queues the suite configures.
QUEUES: dict[str, dict[str, Any]] = {
    "fair-two": {"key_concurrency": 2},
    "fair-capped": {"key_concurrency": 2, "concurrency": 3},
    "fair-rated": {"key_rate": "2/h"},
    "fair-plain": {},
}

#: Step function -> its queue.
FUNCTIONS = {
    "fair.two": "fair-two",
    "fair.capped": "fair-capped",
    "fair.rated": "fair-rated",
}


def _echo(data: Any, ctx: Any) -> Any:
    return {"step": ctx.step_name}


@workflow("fair.idle")
def _idle(run: Any, input: Any) -> Any:
    """A run whose steps the suite schedules itself."""
    return None


@workflow("fair.keyed")
def _keyed(run: Any, input: Any) -> Any:
    """A step under the run's key, and one under a key of its own."""
    run.step("inherits", "fair.two", {})
    run.step("overrides", "fair.two", {}, queue_key="other")
    return "done"


class QueueFairnessConformanceTests(WorkflowConformanceSuite):
    """Rules Q1–Q9 of per-key queue limits and fair claims (see the module's docstring)."""

    def setUp(self) -> None:
        """Configure the suite's queues (beside yours) and register its step functions, for
        this test only."""
        super().setUp()  # type: ignore[misc]
        configured = dict(getattr(settings, "DJANGO_LEASES", {}) or {})
        configured["QUEUES"] = {**(configured.get("QUEUES") or {}), **QUEUES}
        self.enterContext(override_settings(DJANGO_LEASES=configured))  # type: ignore[attr-defined]
        for name, queue in FUNCTIONS.items():
            step_function(name, queue=queue)(_echo)
        self.addCleanup(self._forget_functions)  # type: ignore[attr-defined]

    def _forget_functions(self) -> None:
        for name in FUNCTIONS:
            registry._step_functions.pop(name, None)
            registry._step_options.pop(name, None)

    # -- hooks -----------------------------------------------------------------------------

    def lapse_step_lease(self, step_id: int) -> None:
        """Make step ``step_id``'s lease read as lapsed on the database clock (its worker
        died): ``lease_expires_at`` set to database now − 1 s, by the database."""
        self.steps.filter(pk=step_id).update(lease_expires_at=db_now_plus(-1.0))

    # -- helpers ---------------------------------------------------------------------------

    def _run(self, queue_key: str | None = None) -> uuid.UUID:
        return start_workflow("fair.idle", {}, using=self.workflow_database, queue_key=queue_key)

    def _queue(
        self, run_id: uuid.UUID, function: str, key: str, names: list[str], **extra: Any
    ) -> None:
        for name in names:
            self.steps.schedule(
                run_id, name, function, {}, queue=FUNCTIONS[function], queue_key=key, **extra
            )

    def _claim_all(self) -> list[str]:
        names = []
        while (claim := self.steps.claim_due(LEASE, queues=sorted(QUEUES))) is not None:
            names.append(claim.step_name)
        return names

    # -- Q1–Q2: arguments and settings -----------------------------------------------------

    def test_q1_a_bad_queue_key_is_refused_with_nothing_written(self) -> None:
        """Q1: ``queue_key`` not a ``str`` of 1–255 characters → ``ValueError``, no run."""
        before = self.runs.count()
        for bad in ["", "k" * 256, 7, b"key"]:
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                start_workflow("fair.idle", {}, using=self.workflow_database, queue_key=bad)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            StepOptions(queue_key="")
        self.assertEqual(self.runs.count(), before)
        run_id = self._run("k" * 255)
        self.assertEqual(self.runs.get(pk=run_id).queue_key, "k" * 255)

    def test_q2_bad_per_key_settings_are_clear_errors(self) -> None:
        """Q2: ``key_concurrency`` not an integer ≥ 1, or a malformed ``key_rate`` → a
        :class:`QueueConfigError` naming the option."""
        for option, bad in [
            ("key_concurrency", 0),
            ("key_concurrency", True),
            ("key_concurrency", "2"),
            ("key_rate", "2/d"),
            ("key_rate", 5),
        ]:
            queues = {"fair-bad": {option: bad}}
            with (
                self.subTest(option=option, bad=bad),
                override_settings(DJANGO_LEASES={"QUEUES": queues}),
                self.assertRaisesRegex(QueueConfigError, option),
            ):
                queue_limits()
        limits = queue_limits()["fair-two"]
        self.assertTrue(limits.keyed and limits.limited)
        self.assertEqual(limits.key_concurrency, 2)

    # -- Q3–Q4: key_concurrency ------------------------------------------------------------

    def test_q3_at_most_key_concurrency_steps_of_one_key_run(self) -> None:
        """Q3: with ``key_concurrency=2``, a key with two running steps gets no third
        claim while other keys are still claimed; a finished step, or one whose lease
        lapsed on the database clock, frees its slot."""
        run_id = self._run()
        self._queue(run_id, "fair.two", "a", [f"a{n}" for n in range(5)])
        self._queue(run_id, "fair.two", "b", ["b0", "b1", "b2"])
        claimed = self._claim_all()
        self.assertEqual(sorted(claimed), ["a0", "a1", "b0", "b1"])
        first_a = self.steps.get(run_id=run_id, step_name="a0")
        self.lapse_step_lease(first_a.pk)
        again = self._claim_all()
        self.assertEqual(len(again), 1)
        self.assertTrue(again[0].startswith("a"), again)
        self.assertEqual(self.steps.key_running("fair-two", "a"), 2)

    def test_q4_the_queue_wide_concurrency_holds_beside_the_key_limit(self) -> None:
        """Q4: ``concurrency=3`` with ``key_concurrency=2``: three keys' steps, never more
        than three running in all, never more than two of a key; a finished step frees a
        slot of the queue and of its key."""
        run_id = self._run()
        for key in "abc":
            self._queue(run_id, "fair.capped", key, [f"{key}{n}" for n in range(3)])
        claims = []
        while (claim := self.steps.claim_due(LEASE, queues=["fair-capped"])) is not None:
            claims.append(claim)
        self.assertEqual(len(claims), 3)
        self.assertEqual(len({c.step_name[0] for c in claims}), 3, "round-robin over keys")
        execute_step(claims[0])
        more = self.steps.claim_due(LEASE, queues=["fair-capped"])
        self.assertIsNotNone(more)
        self.assertIsNone(self.steps.claim_due(LEASE, queues=["fair-capped"]))

    # -- Q5: key_rate ----------------------------------------------------------------------

    def test_q5_at_most_key_rate_starts_of_one_key_in_the_window(self) -> None:
        """Q5: ``key_rate="2/h"``: two starts of each key, the rest wait."""
        run_id = self._run()
        self._queue(run_id, "fair.rated", "a", ["a0", "a1", "a2"])
        self._queue(run_id, "fair.rated", "b", ["b0", "b1", "b2"])
        self.assertEqual(sorted(self._claim_all()), ["a0", "a1", "b0", "b1"])

    # -- Q6–Q7: round-robin ----------------------------------------------------------------

    def test_q6_a_key_queued_after_a_backlog_is_served_at_once(self) -> None:
        """Q6: 30 steps of key ``big`` queued before 3 of key ``small``: the keys alternate
        from the first claim on, so the 3 all start among the first 6 claims."""
        run_id = self._run()
        self._queue(run_id, "fair.two", "big", [f"big{n:02}" for n in range(30)])
        self._queue(run_id, "fair.two", "small", ["small0", "small1", "small2"])
        order = []
        for _ in range(33):
            claim = self.steps.claim_due(LEASE, queues=["fair-two"])
            if claim is None:
                break
            order.append(claim.step_name)
            execute_step(claim)
        self.assertEqual(len(order), 33)
        smalls = [index for index, name in enumerate(order) if name.startswith("small")]
        self.assertEqual(len(smalls), 3)
        self.assertTrue(max(smalls) < 6, order[:8])
        bigs = [name for name in order if name.startswith("big")]
        self.assertEqual(bigs, sorted(bigs), "first due first within a key")

    def test_q7_round_robin_is_within_a_priority(self) -> None:
        """Q7: a higher priority goes first whatever its key's turn."""
        run_id = self._run()
        self._queue(run_id, "fair.two", "a", ["a-low"])
        self._queue(run_id, "fair.two", "b", ["b-low"])
        self._queue(run_id, "fair.two", "a", ["a-high"], priority=5)
        first = self.steps.claim_due(LEASE, queues=["fair-two"])
        assert first is not None
        self.assertEqual(first.step_name, "a-high")
        execute_step(first)
        second = self.steps.claim_due(LEASE, queues=["fair-two"])
        assert second is not None
        self.assertEqual(second.step_name, "b-low", "key a was just served")

    # -- Q8: a step run inline -------------------------------------------------------------

    def test_q8_a_step_a_pass_runs_inline_waits_its_keys_turn(self) -> None:
        """Q8: a pass may run a new step of a keyed queue inline only when no due step of
        another key comes first in the round-robin order; else the step waits in the queue
        (pending) and is claimed in turn."""
        run_id = self._run()
        self._queue(run_id, "fair.two", "a", ["a0"])
        served = self.steps.claim_due(LEASE, queues=["fair-two"])
        assert served is not None
        execute_step(served)
        self._queue(run_id, "fair.two", "b", ["b0"])
        run = self.runs.get(pk=run_id)
        options = StepOptions(queue="fair-two", queue_key="a")

        def inline(step_name: str) -> bool:  # whether the pass may run it inline
            scheduled = self.steps.schedule_claimed(
                run_id,
                NextStep(step_name, "fair.two", {}, options),
                lease_ttl_seconds=LEASE,
                finish_pass=run.pass_requests,
            )
            return scheduled.claim is not None

        self.assertFalse(inline("a1"), "key b's turn comes first")
        self.assertEqual(self.steps.get(run_id=run_id, step_name="a1").status, "pending")
        self.assertEqual(self._claim_all(), ["b0", "a1"])
        self.assertTrue(inline("a2"), "no other key waits: it runs inline")

    # -- Q9: the run's key -----------------------------------------------------------------

    def test_q9_a_runs_queue_key_reaches_its_steps_and_a_step_may_override_it(self) -> None:
        """Q9: ``start_workflow(queue_key=)`` is the key of the run's steps in a keyed queue;
        ``run.step(queue_key=)`` overrides it."""
        run_id = start_workflow(
            "fair.keyed", {}, using=self.workflow_database, queue_key="tenant-1"
        )
        drive(run_id, using=self.workflow_database)
        self.assertEqual(self.runs.get(pk=run_id).status, "completed")
        keys = dict(self.steps.filter(run_id=run_id).values_list("step_name", "queue_key"))
        self.assertEqual(keys, {"inherits": "tenant-1", "overrides": "other"})


__all__ = ["LEASE", "QUEUES", "QueueFairnessConformanceTests"]
