"""Forking a run from one of its steps (:class:`RunForks`, the top layer of
``WorkflowRun.objects``; ``django_leases.workflows.fork_run`` calls it).

A fork is a new run of the same workflow, input and tags whose outcomes recorded **before**
the chosen step are copied into it, so its first pass replays them, and which runs the chosen
step and everything after it again, with the code deployed now. The original run is only
read. What "before" means:

* **steps**: those the run created before the chosen one (lower id: the order in which the
  workflow reached them), that had an outcome for good — succeeded, or failed with no
  attempt left (a workflow that caught that failure meets it again). Steps still pending,
  running or waiting out a retry run again, and so do steps the run's end stopped (failed
  with a cancel's or a deadline's error: they did not fail on their own);
* **patch decisions** (``run.patched``): those recorded before the chosen step. One the run
  first met after it had gone past the patch's place (answered ``False``) was recorded after
  the chosen step: the fork, which runs that step again, decides it afresh (today's path);
* **waits** (sleeps, events, child runs): those the run reached before the chosen step's
  first attempt started, on the database clock, and that were decided — a sleep done, an
  event delivered (its payload kept) or timed out, a child run's wait. A copied child wait
  points at the same child run, which stays the original's child: the fork reads its outcome
  and starts no new one. So a fork is refused while such a child is running again (resumed
  or retried since), or when it was pruned; while the fork is not finished, the child is
  not resumed or retried, and a prune keeps it. An event sent early to the original and not
  reached yet is not copied.

The chosen step's own attempts, results and progress are not copied (it starts at attempt 1),
nor any attempt history: the fork's history starts with what it runs.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Q
from django.utils.translation import gettext

from django_leases import db
from django_leases.clock import DbNow
from django_leases.exceptions import WorkflowDeadlineExceeded
from django_leases.models.patches import RunReplays
from django_leases.models.workflow_base import (
    attempt_model,
    lock_runs,
    refused_in_state,
    step_model,
    wait_model,
    wake_workers,
)
from django_leases.validation import check_identifier, parse_run_id
from django_leases.workflows.values import (
    FINISHED_RUN_STATUSES,
    REPLAYED_STEP_FIELDS,
    RETRY_DELAY_FIELDS,
    RUN_CANCELLED,
    STEP_FAILED,
    RunStatus,
    StepStatus,
    WaitKind,
    WaitStatus,
    exhausted,
    failed_for_good_q,
)

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowRun

#: The step columns a fork copies (the outcome and the options; never a lease or a claim).
_STEP_COPIED = (
    *REPLAYED_STEP_FIELDS,
    "data",
    *RETRY_DELAY_FIELDS,
    "timeout",
    "queue",
    "priority",
    "progress",
)
#: The error codes a running step attempt is failed with when its run ends under it (a
#: cancel, a deadline): the step did not fail on its own, so a fork runs it again.
_STOPPED_BY_RUN_END = frozenset({RUN_CANCELLED, WorkflowDeadlineExceeded.code})


def _stopped_by_run_end(step: dict[str, Any]) -> bool:
    """Whether a step row (``values()`` of :data:`_STEP_COPIED`) failed because its run ended
    under it, not on its own."""
    error = step["error"]
    return (
        step["status"] == StepStatus.FAILED
        and isinstance(error, dict)
        and error.get("code") in _STOPPED_BY_RUN_END
    )


#: The wait columns a fork copies.
_WAIT_COPIED = ("name", "kind", "status", "due_at", "payload", "child_id", "reached_at", "done_at")


class RunForks(RunReplays):
    """Forking a run from a step (see the module's docstring)."""

    def fork(self, run_id: uuid.UUID | str, from_step: str) -> WorkflowRun:
        """Create a ``running`` run of run ``run_id``'s workflow, input, tags and queue key, its
        ``forked_from`` that run, with the outcomes the run recorded before step
        ``from_step`` copied (see the module's docstring), due for its first pass at once;
        one transaction. The original run is not written, whatever its status (a running
        one goes on: cancel it if the fork replaces it). No key is copied (keys are unique
        per workflow), nor the parent: a fork of a child run is a run of its own.

        Returns the new run. Raises ``WorkflowRun.DoesNotExist`` for an unknown run,
        ``ValueError`` for a malformed id or step name, a step the run never reached, the
        name of one of its patch decisions, or a child run it would read that was pruned,
        and :class:`WorkflowRunStateError` when such a child is running again (resumed or
        retried: fork once it finished); nothing is written then.
        """
        check_identifier(from_step, "Step name")
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        steps = step_model()._default_manager.using(alias)
        waits = wait_model()._default_manager.using(alias)
        with transaction.atomic(using=alias):
            # The child runs the fork may read are locked first, children before their parent
            # as a cancel locks them: a resume or retry of one waits for the fork and then
            # sees its wait, or has set it running by the time the fork reads its status.
            self._lock_children(alias, pk)
            # Locked: a prune deleting the run meanwhile either waits for the fork, or has
            # deleted it by the time the lock is granted (then: no such run).
            original = db.for_update(self.rows().filter(pk=pk), alias).first()
            if original is None:
                raise self.model.DoesNotExist(f"No workflow run with id {pk}")
            start = steps.filter(run_id=pk, step_name=from_step).values_list("pk", "status")
            found = start.first()
            if found is not None and found[1] == StepStatus.PATCH:
                raise ValueError(
                    f"{from_step!r} is a patch decision of run {pk} (run.patched), not a "
                    "step: a fork starts again from a step"
                )
            start_id = None if found is None else found[0]
            if start_id is None:
                raise ValueError(
                    f"Run {pk} never reached a step named {from_step!r}: a fork starts "
                    "again from a step the run recorded"
                )
            first_claim = (
                attempt_model()
                ._default_manager.using(alias)
                .filter(step_id=start_id)
                .order_by("attempt")
                .values_list("started_at", flat=True)
                .first()
            )
            copied = (
                steps.filter(run_id=pk, pk__lt=start_id)
                .filter(
                    Q(status=StepStatus.SUCCEEDED)
                    | failed_for_good_q()
                    # The patch decisions recorded before the step: the fork replays the
                    # same path up to it (run.patched answers as it did for the original).
                    # One recorded after it (a patch deployed while the run was parked past
                    # its place) is decided again: the fork runs the step with today's code.
                    | Q(status=StepStatus.PATCH)
                )
                .order_by("id")
                .values(*_STEP_COPIED)
            )
            kept_steps = [row for row in copied if not _stopped_by_run_end(row)]
            kept_waits = waits.filter(run_id=pk, reached_at__isnull=False).exclude(
                status=WaitStatus.WAITING
            )
            if first_claim is not None:
                kept_waits = kept_waits.filter(reached_at__lt=first_claim)
            wait_rows = list(kept_waits.order_by("id").values(*_WAIT_COPIED))
            # A child reached since the first lock (the original still runs) is locked now.
            self._lock_children(alias, pk, only={row["child_id"] for row in wait_rows})
            self._require_children_read(pk, from_step, wait_rows)
            fork = self._create_tagged(
                alias,
                workflow=original.workflow,
                input=original.input,
                tags=original.tags,
                queue_key=original.queue_key,
                forked_from_id=pk,
                status=RunStatus.RUNNING,
                pass_due_at=DbNow(),
                pass_requests=1,
            )
            steps.bulk_create(step_model()(run_id=fork.pk, **row) for row in kept_steps)
            waits.bulk_create(wait_model()(run_id=fork.pk, **row) for row in wait_rows)
            wake_workers(alias)
        self._started(alias, fork.pk, fork.workflow)
        return fork

    def _lock_children(
        self, alias: str, pk: uuid.UUID, only: set[uuid.UUID | None] | None = None
    ) -> None:
        """Lock the child runs run ``pk``'s waits point at (``only``: those of them in this
        set), in a cancel's order (oldest first)."""
        waits = (
            wait_model()
            ._default_manager.using(alias)
            .filter(run_id=pk, kind=WaitKind.CHILD, child_id__isnull=False)
        )
        if only is not None:
            waits = waits.filter(child_id__in=[child for child in only if child is not None])
        lock_runs(alias, self.rows().filter(pk__in=waits.values("child_id")))

    def _require_children_read(
        self, pk: uuid.UUID, from_step: str, wait_rows: list[dict[str, Any]]
    ) -> None:
        """Refuse a fork whose copied child waits would not read the outcome the original
        read: a child run pruned since (from a database pruned before a child was kept with
        its parent: ``ValueError``), or one set running again since (resumed or retried:
        :class:`WorkflowRunStateError`; the fork would wait for an end that wakes only the
        child's parent)."""
        children = {
            row["child_id"]: row["name"] for row in wait_rows if row["kind"] == WaitKind.CHILD
        }
        if None in children:
            raise ValueError(
                f"The child run of run {pk}'s wait {children[None]!r} was pruned: a fork from "
                f"{from_step!r} could not read its outcome; fork from a step the run reached "
                "before that run.child"
            )
        unfinished = (
            self.rows()
            .filter(pk__in=children)
            .exclude(status__in=FINISHED_RUN_STATUSES)
            .values_list("pk", "status")
            .first()
        )
        if unfinished is not None:
            child, status = unfinished
            raise refused_in_state(
                child,
                status,
                gettext("forked past it"),
                gettext(
                    "run %(run)s reads it as its child %(name)r, and a fork reads the outcome "
                    "it had; fork once it finished, or from a step before it: run %(run)s "
                    "cannot be"
                )
                % {"run": pk, "name": children[child]},
            )

    def fork_from_failed(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """:meth:`fork` run ``run_id`` from the step that failed it: the repair of a run that
        failed, once code that handles what made that step fail is deployed. That step is
        the one the run's error names (code ``STEP_FAILED``); for a run that ended
        otherwise (the workflow raised, a cancel, a deadline), its latest step that failed
        for good or was stopped by that end, in the order the workflow reached its steps.
        A failure the workflow caught and went on from is not where the fork starts: the
        steps that succeeded after it would run again. Returns the new run. Raises
        ``WorkflowRun.DoesNotExist`` for an unknown run and ``ValueError`` for a malformed
        id or a run with no such step (nothing written)."""
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        error = self.rows().filter(pk=pk).values_list("error", flat=True).first()
        steps = step_model()._default_manager.using(alias).filter(run_id=pk)
        named = None
        if isinstance(error, dict) and error.get("code") == STEP_FAILED:
            named = error.get("step_name")
        failed = steps.filter(status=StepStatus.FAILED).order_by("-id")
        if named:
            step_name = failed.filter(step_name=named).values_list("step_name", flat=True).first()
        else:
            step_name = next(
                (
                    row["step_name"]
                    for row in failed.values("step_name", "status", "attempt", "retries", "error")
                    if exhausted(row["attempt"], row["retries"]) or _stopped_by_run_end(row)
                ),
                None,
            )
        if step_name is None:
            if not self.rows().filter(pk=pk).exists():
                raise self.model.DoesNotExist(f"No workflow run with id {pk}")
            raise ValueError(f"Run {pk} has no failed step to fork from")
        return self.fork(pk, step_name)


__all__ = ["RunForks"]
