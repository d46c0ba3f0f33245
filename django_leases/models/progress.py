"""What a running attempt says of its progress (:class:`StepProgress`, the top layer of
``WorkflowStep.objects``): ``ctx.set_progress(value)`` in a step function lands here,
fenced to the attempt like its result.
"""

from __future__ import annotations

from typing import Any

from django.db.models import JSONField, Value

from django_leases.clock import DbNow
from django_leases.models.exactly import StepTransactions
from django_leases.models.workflow_base import fence_q
from django_leases.validation import check_attempt, check_json


class StepProgress(StepTransactions):
    """The progress a running attempt reports."""

    def set_progress(self, step_id: int, value: Any, attempt: int) -> None:
        """Keep JSON ``value`` as the step's ``progress``, for ``attempt`` only.

        One ``UPDATE`` through the fence (:func:`~django_leases.models.workflow_base.
        fence_q`): it lands while ``attempt`` is the step's running attempt, and a superseded
        attempt, a finished one or one stopped by a cancel writes nothing. The value stays
        once the attempt ends (a later attempt overwrites it when it reports its own).

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt
                (``WorkflowStepCancelledError`` when its run was cancelled); nothing written.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``value`` is not JSON the database stores, or a bad attempt.
        """
        check_attempt(attempt)
        alias = self.write_alias()
        check_json(value, "Step progress", using=alias)
        fenced = self.rows().filter(fence_q(step_id, attempt))
        # One statement: atomic on its own.
        if not fenced.update(progress=Value(value, output_field=JSONField()), updated_at=DbNow()):
            self._refuse(alias, step_id, attempt)


__all__ = ["StepProgress"]
