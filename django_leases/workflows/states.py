"""Status vocabularies of workflow runs, steps and attempts (DESIGN §5).

They live apart from the models so the store's QuerySets and the models can both import them
without a cycle; :mod:`django_leases.models` re-exports them.
"""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    """A run is ``running`` until its workflow returns (``completed``) or raises (``failed``).

    ``suspended`` waits for an operator (e.g. a step function missing from the deployed code);
    ``cancelled`` was stopped by an operator.
    """

    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(models.TextChoices):
    """``pending``: created by a pass, never claimed. ``scheduled``: waiting to be claimed again
    at the same attempt (e.g. after a resume). ``running``: claimed under a step lease.
    ``succeeded`` / ``failed``: the current attempt's outcome (a failed step with retries left
    is claimed again as attempt + 1 once ``available_at`` has passed).
    """

    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class AttemptStatus(models.TextChoices):
    """One attempt's outcome. A superseded attempt stays ``running`` for ever."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


#: Error code of a run suspended because a step function is not registered in this process.
STEP_FUNCTION_NOT_FOUND = "STEP_FUNCTION_NOT_FOUND"
#: Error code of a run suspended because its workflow is not registered in this process.
WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"
#: Error code of a step whose every attempt lost its worker (lease lapsed).
STEP_LEASE_LAPSED = "STEP_LEASE_LAPSED"
#: Error code of a step whose function returned something that is not JSON.
STEP_RESULT_NOT_JSON = "STEP_RESULT_NOT_JSON"
#: Error code of a run failed because a step failed on its last attempt.
STEP_FAILED = "STEP_FAILED"
#: Error code of a run whose workflow function raised.
WORKFLOW_ERROR = "WORKFLOW_ERROR"
#: Error code of a run stopped by an operator, and of the step attempt it stopped.
RUN_CANCELLED = "RUN_CANCELLED"
