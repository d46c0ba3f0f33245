"""Code that changes under running runs (DESIGN §5c): a run's recorded answers to
``run.patched(name)`` (:class:`StepPatches`, the top layer of ``WorkflowStep.objects``) and
the batched reads a replay check makes of live runs (:class:`RunReplays`, the top layer of
``WorkflowRun.objects``).

Where a patch decision lives: a **marker row in the step table** — status ``patch``, the
patch's name as its ``step_name``, ``true`` or ``false`` as its ``result``, no step function
— rather than a field on the run, because:

* it takes its id from the same sequence as the run's steps, at the moment the pass first
  reached the patch, so the run's records keep the exact order in which it met its steps
  and its patches (what a replay check compares, and what a fork from a step keeps: the
  decisions made before that step, and not the ones after it);
* every pass already reads the run's step rows in the statement that picks it (the tuned
  pick and the portable read alike), so a recorded decision costs a pass no extra read; a
  field on the run would need one more read (the tuned pick returns fixed columns) and a
  read-modify-write of the run's JSON, the row every pass writes;
* a name is unique per run in that table, so two passes racing to decide one patch record
  one answer (the first insert wins and both return it).

A marker is never claimed or counted as work: its status is none of the waiting or running
ones (no partial index of the step table holds it), operators' operations skip it, and a
step or wait cannot take its name.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_leases.models.outcomes import write_pending
from django_leases.models.results import StepResults
from django_leases.models.timing import RunTiming
from django_leases.validation import check_identifier, parse_run_id
from django_leases.workflows.values import (
    REPLAYED_STEP_FIELDS,
    PendingResult,
    RunStatus,
    StepStatus,
)

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowRun, WorkflowStep

#: Statuses of a run a replay check replays (a sleeping or waiting run is ``running``).
LIVE_RUN_STATUSES = (RunStatus.RUNNING, RunStatus.SUSPENDED)

#: The fields of a step a replay reads.
REPLAY_STEP_FIELDS = ("run_id", "id", *REPLAYED_STEP_FIELDS, "created_at")


class StepPatches(StepResults):
    """Recording a run's answer to ``run.patched(name)``; reading many runs' steps at once."""

    def record_patch(
        self,
        run_id: uuid.UUID | str,
        name: str,
        patched: bool,
        *,
        pending: PendingResult | None = None,
    ) -> WorkflowStep:
        """Record that run ``run_id`` answered ``run.patched(name)`` with ``patched``, or
        find the answer it recorded before (the first recorded answer sticks: a second call
        returns that row and writes nothing). ``pending``: a step result the run's pass
        carries, written first in the same transaction
        (:func:`~django_leases.models.outcomes.write_pending`).

        Returns the marker row (status ``patch``; ``result`` is the recorded ``bool``).

        Raises:
            ValueError: a bad name, or ``name`` is a step of the run (not a patch); nothing
                is written then.
            WorkflowStepSupersededError: ``pending``'s attempt was superseded (nothing
                written).
        """
        check_identifier(name, "Patch name")
        if not isinstance(patched, bool):
            raise ValueError(f"patched must be a bool, not {type(patched).__name__}")
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            marker, _ = self.rows().get_or_create(
                run_id=pk,
                step_name=name,
                defaults={
                    "function_name": "",
                    "data": {},
                    "status": StepStatus.PATCH,
                    "result": patched,
                    "retries": 0,
                },
            )
            if marker.status != StepStatus.PATCH:
                raise ValueError(
                    f"{name!r} is the name of a step of run {pk}; a patch needs a name of its own"
                )
        return marker

    def for_replay(self, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
        """The steps (and patch markers) of the runs ``run_ids`` in one read, by run, each
        run's in the order they were recorded (by id), as dicts of
        :data:`REPLAY_STEP_FIELDS`."""
        found: dict[uuid.UUID, list[dict[str, Any]]] = {pk: [] for pk in run_ids}
        rows = self.rows().filter(run_id__in=list(run_ids)).order_by("run_id", "id")
        for row in rows.values(*REPLAY_STEP_FIELDS):
            found[row["run_id"]].append(row)
        return found


class RunReplays(RunTiming):
    """The live runs a replay check reads, in batches."""

    def live_batches(
        self,
        batch_size: int = 1000,
        *,
        only: Sequence[uuid.UUID] | None = None,
        statuses: Sequence[str] = LIVE_RUN_STATUSES,
    ) -> Iterator[list[WorkflowRun]]:
        """Every live run (``running`` — a sleeping or waiting one too — and ``suspended``;
        ``statuses``: those instead), in lists of at most ``batch_size`` (int ≥ 1), by id;
        each list is one read of ``id``, ``workflow``, ``status`` and ``input``, found after
        the previous list's last id (a run started meanwhile is read if its id sorts later).
        ``only``: just those of these run ids that are live.

        Raises:
            ValueError: a bad ``batch_size``.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int ≥ 1, not {batch_size!r}")
        live = (
            self.rows()
            .filter(status__in=list(statuses))
            .only("id", "workflow", "status", "input")
            .order_by("id")
        )
        if only is not None:
            live = live.filter(pk__in=list(only))
        after: uuid.UUID | None = None
        while True:
            batch = list((live if after is None else live.filter(pk__gt=after))[:batch_size])
            if not batch:
                return
            yield batch
            if len(batch) < batch_size:
                return
            after = batch[-1].pk


__all__ = ["LIVE_RUN_STATUSES", "REPLAY_STEP_FIELDS", "RunReplays", "StepPatches"]
