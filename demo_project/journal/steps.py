"""``journalled``: what the demo's step functions wrap their work in.

::

    @step_function("previews.build")
    def build(data, ctx):
        with journalled(ctx, "build-preview") as entry:
            ...                                   # the work
            entry.write(PreviewBuild, build_id=…)  # fenced by ctx.attempt
            return {...}

It records a :class:`~demo_project.journal.models.StepExecution` row when the attempt starts
and its outcome when it ends: ``done`` (nothing written), ``landed`` / ``refused`` (from
:meth:`Entry.write`), ``stopped``
(the step lease was lost: ``ctx.check()`` raised) or ``failed``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from demo_project.journal.models import Outcome, StepExecution, worker_name
from django_leases.exceptions import LeaseLostError

logger = logging.getLogger("demo_project")


class Entry:
    """The attempt being journalled; :meth:`write` makes its fenced writes."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.outcome: str = Outcome.DONE
        self.detail = ""

    def landed(self, detail: str) -> None:
        """Note a write of the step's own that landed (one not made by :meth:`write`)."""
        if self.outcome != Outcome.REFUSED:
            self.outcome = Outcome.LANDED
            self.detail = detail

    def write(self, model: Any, **values: Any) -> bool:
        """Write ``values`` to ``model``'s row for this run, fenced by this attempt
        (:meth:`AttemptFencedQuerySet.record`). A refusal is logged and journalled; returns
        whether the write landed (``bool``)."""
        ctx = self.ctx
        landed = bool(
            model.objects.record(ctx.run_id, ctx.attempt, written_by=worker_name(), **values)
        )
        if landed:
            if self.outcome != Outcome.REFUSED:
                self.outcome = Outcome.LANDED
        else:
            self.outcome = Outcome.REFUSED
            self.detail = f"{model.__name__}: a later attempt already wrote this run's row"
            logger.warning(
                "Demo: step %r of run %s, attempt %d: its %s write was refused (stale attempt: "
                "a later attempt already wrote it)",
                ctx.step_name,
                ctx.run_id,
                ctx.attempt,
                model.__name__,
            )
        return landed


@contextmanager
def journalled(ctx: Any, workflow: str) -> Iterator[Entry]:
    """Journal one step attempt (``ctx`` is the ``StepContext``; ``workflow`` its name)."""
    StepExecution.objects.begin(ctx, workflow)
    entry = Entry(ctx)
    try:
        yield entry
    except LeaseLostError:
        StepExecution.objects.finish(ctx, Outcome.STOPPED, "the step lease was lost")
        raise
    except Exception as exc:
        StepExecution.objects.finish(ctx, Outcome.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    StepExecution.objects.finish(ctx, entry.outcome, entry.detail)
