"""A conformance suite for ``run.patched(name)`` — code that changes under running runs
(DESIGN §5c) — runnable against your own database.

The rules, pinned on whole runs driven to their end (:func:`~django_leases.testing.drive`),
with the code "deployed" between two passes:

* R1 — a run that had gone past the patch before the patch existed keeps the old path
  (``patched`` is ``False``), and the answer is recorded;
* R2 — a run started on the new code takes the new path (``True``), and the answer sticks
  for its later passes, although by then the run recorded what the new path did (a pass
  that decided afresh would answer ``False`` there);
* R3 — a patch inside a loop: one name is decided once for every iteration; a name per
  iteration switches at the first iteration the run had not reached;
* R4 — a patch after a sleep or an event wait: a run that waited there when the patch
  arrived takes the new path once the wait is over, and one that had gone past keeps the old;
* R5 — a patch name that is a step's name, or a bad name, is refused with nothing recorded.

Mix :class:`WorkflowPatchConformanceTests` into a ``TransactionTestCase``::

    from django.test import TransactionTestCase

    from django_leases.testing.patches import WorkflowPatchConformanceTests


    class WorkflowPatches(WorkflowPatchConformanceTests, TransactionTestCase):
        workflow_database = "default"
        databases = {"default"}

The suite registers its own workflows (named ``django_leases.conformance.patches.*``) and
step function when its class is set up; a deploy is a switch of the code those workflows
run (:meth:`WorkflowPatchConformanceTests.deploy`).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from django_leases.models import WorkflowRun
from django_leases.testing.base import WorkflowConformanceSuite
from django_leases.testing.driving import drive
from django_leases.workflows.engine import send_event, start_workflow
from django_leases.workflows.registry import step_function, workflow
from django_leases.workflows.values import RunStatus, StepStatus

PREFIX = "django_leases.conformance.patches"
#: The suite's step function: returns its data.
ECHO = f"{PREFIX}.echo"

#: The code version the suite's workflows run (1: before the patch, 2: with it).
_deployed = {"version": 1}


def _new_code() -> bool:
    return _deployed["version"] >= 2


def echo(data: Any, ctx: Any) -> Any:
    """The suite's step function: returns ``data``."""
    return data


def insert(run: Any, input: Any) -> Any:
    """A step inserted (``b-new`` in place of ``b``) under a patch, before an event wait."""
    out = [run.step("a", ECHO, "a")]
    if _new_code() and run.patched("new-b"):
        out.append(run.step("b-new", ECHO, "b-new"))
    else:
        out.append(run.step("b", ECHO, "b"))
    out.append(run.wait_for_event("go"))
    out.append(run.step("c", ECHO, "c"))
    return out


def loop(run: Any, input: Any) -> Any:
    """A patch inside a loop: one name for all iterations, or one name per iteration."""
    out = []
    for i in range(3):
        name = f"new-{i}" if input["per_iteration"] else "new"
        new = _new_code() and run.patched(name)
        out.append(run.step(f"{'n' if new else 's'}{i}", ECHO, f"{'n' if new else 's'}{i}"))
        run.wait_for_event(f"go{i}")
    return out


def _patched_b(run: Any, patch: str) -> Any:
    """Step ``b-new`` under patch ``patch`` (``b`` in the old code), then the wait for the
    event ``go``; returns what the step returned."""
    if _new_code() and run.patched(patch):
        taken = run.step("b-new", ECHO, "b-new")
    else:
        taken = run.step("b", ECHO, "b")
    run.wait_for_event("go")
    return taken


def after_sleep(run: Any, input: Any) -> Any:
    """A patch right after a sleep."""
    run.step("a", ECHO, "a")
    run.sleep("nap", 3600)
    return _patched_b(run, "after-nap")


def after_event(run: Any, input: Any) -> Any:
    """A patch right after an event wait."""
    run.step("a", ECHO, "a")
    run.wait_for_event("first")
    return _patched_b(run, "after-first")


def clash(run: Any, input: Any) -> Any:
    """Asks ``run.patched`` with the name of one of its steps."""
    run.step("a", ECHO, "a")
    return run.patched("a")


_WORKFLOWS = {
    "insert": insert,
    "loop": loop,
    "after-sleep": after_sleep,
    "after-event": after_event,
    "clash": clash,
}


class WorkflowPatchConformanceTests(WorkflowConformanceSuite):
    """Rules R1–R5 as ``test_*`` methods; mix into ``TransactionTestCase``. Override
    :attr:`workflow_database` for another alias."""

    registered: ClassVar[bool] = False

    @classmethod
    def setUpClass(cls) -> None:
        """Register the suite's step function and workflows (again: the same functions)."""
        super().setUpClass()  # type: ignore[misc]
        step_function(ECHO)(echo)
        for name, func in _WORKFLOWS.items():
            workflow(f"{PREFIX}.{name}")(func)

    def setUp(self) -> None:
        """Every rule starts on the code before the patches (version 1)."""
        super().setUp()  # type: ignore[misc]
        self.deploy(1)

    # -- the harness ------------------------------------------------------------------------

    def deploy(self, version: int) -> None:
        """**Harness hook.** Make the suite's workflows run code ``version`` from their next
        pass on (1: before the patches, 2: with them)."""
        _deployed["version"] = version

    def start(self, name: str, input: Any = None) -> uuid.UUID:
        """Start a run of the suite's workflow ``name`` with JSON ``input``; its id."""
        return start_workflow(f"{PREFIX}.{name}", input, using=self.workflow_database)

    def drive(self, run_id: uuid.UUID, *, skip_sleeps: bool = True) -> WorkflowRun:
        """:func:`~django_leases.testing.drive` every due pass and step; run ``run_id`` then."""
        run = drive(run_id, skip_sleeps=skip_sleeps, using=self.workflow_database)
        assert run is not None
        return run

    def send(self, run_id: uuid.UUID, name: str, payload: Any = None) -> WorkflowRun:
        """Send event ``name`` to run ``run_id``, then :meth:`drive` it."""
        send_event(run_id, name, payload, using=self.workflow_database)
        return self.drive(run_id)

    def decisions(self, run_id: uuid.UUID) -> dict[str, Any]:
        """The run's recorded patch decisions, by name."""
        rows = self.steps.filter(run_id=run_id, status=StepStatus.PATCH)
        return dict(rows.values_list("step_name", "result"))

    def step_names(self, run_id: uuid.UUID) -> list[str]:
        """The run's steps (no patch decision) in the order it recorded them."""
        rows = self.steps.filter(run_id=run_id).exclude(status=StepStatus.PATCH)
        return list(rows.order_by("id").values_list("step_name", flat=True))

    def assertCompleted(self, run: WorkflowRun, output: Any) -> None:
        """Assert that ``run`` completed with ``output``."""
        self.assertEqual((run.status, run.output), (RunStatus.COMPLETED, output), run.error)

    # -- R1, R2: an old run keeps the old path; a new run takes the new one, for good ---------

    def test_r1_a_run_past_the_patch_keeps_the_old_path(self) -> None:
        """R1: a run parked after the patch's place when it is deployed answers False."""
        run_id = self.start("insert")
        self.assertEqual(self.drive(run_id).status, RunStatus.RUNNING)  # waits for "go"
        self.deploy(2)
        run = self.send(run_id, "go", "went")
        self.assertCompleted(run, ["a", "b", "went", "c"])
        self.assertEqual(self.decisions(run_id), {"new-b": False})
        self.assertEqual(self.step_names(run_id), ["a", "b", "c"])

    def test_r2_a_new_run_takes_the_new_path_and_the_answer_sticks(self) -> None:
        """R2: a run on the new code answers True, on every later pass too."""
        self.deploy(2)
        run_id = self.start("insert")
        self.assertEqual(self.drive(run_id).status, RunStatus.RUNNING)  # waits for "go"
        self.assertEqual(self.decisions(run_id), {"new-b": True})
        # The next pass replays a run that recorded b-new and the wait after the patch:
        # deciding afresh it would answer False (and run b); the recorded True sticks.
        run = self.send(run_id, "go", "went")
        self.assertCompleted(run, ["a", "b-new", "went", "c"])
        self.assertEqual(self.decisions(run_id), {"new-b": True})
        self.assertEqual(self.step_names(run_id), ["a", "b-new", "c"])

    # -- R3: a patch inside a loop -------------------------------------------------------------

    def _old_loop_at_second_wait(self, per_iteration: bool) -> uuid.UUID:
        run_id = self.start("loop", {"per_iteration": per_iteration})
        self.drive(run_id)
        self.send(run_id, "go0")  # now waits for go1, s0 and s1 recorded
        self.assertEqual(self.step_names(run_id), ["s0", "s1"])
        self.deploy(2)
        return run_id

    def test_r3_one_patch_name_in_a_loop_is_decided_once(self) -> None:
        """R3: one patch name in a loop is decided on the first iteration, for all."""
        run_id = self._old_loop_at_second_wait(per_iteration=False)
        self.send(run_id, "go1")
        run = self.send(run_id, "go2")
        self.assertCompleted(run, ["s0", "s1", "s2"])  # the old path, every iteration
        self.assertEqual(self.decisions(run_id), {"new": False})
        new_id = self.start("loop", {"per_iteration": False})
        for name in ("go0", "go1"):
            self.drive(new_id)
            send_event(new_id, name, None, using=self.workflow_database)
        run = self.send(new_id, "go2")
        self.assertCompleted(run, ["n0", "n1", "n2"])
        self.assertEqual(self.decisions(new_id), {"new": True})

    def test_r3_a_patch_name_per_iteration_switches_where_the_run_stood(self) -> None:
        """R3: a name per iteration turns True at the first iteration the run had not
        reached."""
        run_id = self._old_loop_at_second_wait(per_iteration=True)
        self.send(run_id, "go1")
        run = self.send(run_id, "go2")
        self.assertCompleted(run, ["s0", "s1", "n2"])
        self.assertEqual(self.decisions(run_id), {"new-0": False, "new-1": False, "new-2": True})

    def _assert_new_and_old_paths(self, new: uuid.UUID, old: uuid.UUID, patch: str) -> None:
        """Send ``go`` to runs ``new`` and ``old``, waiting for it: ``new`` ends on ``b-new``
        (``patch`` answered True), ``old`` on ``b`` (False)."""
        self.assertCompleted(self.send(new, "go"), "b-new")
        self.assertCompleted(self.send(old, "go"), "b")
        self.assertEqual(self.decisions(new), {patch: True})
        self.assertEqual(self.decisions(old), {patch: False})

    # -- R4: a patch after a wait ----------------------------------------------------------------

    def test_r4_a_run_asleep_before_the_patch_takes_the_new_path_after_the_sleep(self) -> None:
        """R4: a run asleep before the patch answers True after the sleep; one past it
        False."""
        past = self.start("after-sleep")
        self.drive(past)  # past the sleep and b: waits for "go"
        asleep = self.start("after-sleep")
        self.assertEqual(self.drive(asleep, skip_sleeps=False).status, RunStatus.RUNNING)
        self.assertEqual(self.step_names(asleep), ["a"])
        self.deploy(2)
        self.drive(asleep)  # the sleep is over: the patch is reached for the first time
        self._assert_new_and_old_paths(asleep, past, "after-nap")

    def test_r4_a_run_waiting_for_an_event_before_the_patch_takes_the_new_path(self) -> None:
        """R4: as for a sleep, after an event wait."""
        waiting = self.start("after-event")
        self.drive(waiting)  # waits for "first"
        past = self.start("after-event")
        self.drive(past)
        self.send(past, "first")  # past the patch's place: waits for "go"
        self.deploy(2)
        self.send(waiting, "first")
        self._assert_new_and_old_paths(waiting, past, "after-first")

    # -- R5: names ------------------------------------------------------------------------------

    def test_r5_a_patch_named_like_a_step_is_refused_with_nothing_recorded(self) -> None:
        """R5: a patch named like a step of the run fails the run; nothing is recorded."""
        run_id = self.start("clash")
        run = self.drive(run_id)
        self.assertEqual(run.status, RunStatus.FAILED)
        self.assertIn("name of a step", str(run.error))
        self.assertEqual(self.decisions(run_id), {})

    def test_r5_record_patch_refuses_bad_input_with_nothing_written(self) -> None:
        """R5: ``record_patch`` refuses a bad name or answer; a second answer is ignored."""
        run_id = self.start("insert")
        for name, value in (("", True), ("x" * 201, True), ("ok", "yes")):
            with self.subTest(name=name[:10], value=value), self.assertRaises(ValueError):
                self.steps.record_patch(run_id, name, value)  # type: ignore[arg-type]
        self.assertEqual(self.decisions(run_id), {})
        first = self.steps.record_patch(run_id, "p", True)
        again = self.steps.record_patch(run_id, "p", False)  # the first answer sticks
        self.assertEqual((first.pk, again.pk, again.result), (first.pk, first.pk, True))
