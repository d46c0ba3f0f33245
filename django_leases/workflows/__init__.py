"""Durable workflows whose steps run under fenced leases (DESIGN §5).

Public API (imported lazily, so importing this package touches no model)::

    from django_leases.workflows import workflow, step_function, start_workflow, send_event
    from django_leases.workflows import astart_workflow, asend_event  # from async code
    from django_leases.workflows import fork_run

``Worker`` (the worker threads), ``execute_step`` / ``run_pass`` (one unit of work each) and
the workflow errors (``WorkflowStepFailedError``, raised by ``run.step`` for a step out of
attempts, and the others of :mod:`django_leases.exceptions`) are here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_leases import lazy_attributes

_LAZY = {
    "workflow": "django_leases.workflows.registry",
    "step_function": "django_leases.workflows.registry",
    "start_workflow": "django_leases.workflows.engine",
    "send_event": "django_leases.workflows.engine",
    "astart_workflow": "django_leases.workflows.engine",
    "asend_event": "django_leases.workflows.engine",
    "fork_run": "django_leases.workflows.operators",
    "execute_step": "django_leases.workflows.engine",
    "StepContext": "django_leases.workflows.engine",
    "run_pass": "django_leases.workflows.driver",
    "RunContext": "django_leases.workflows.driver",
    "Worker": "django_leases.workflows.worker",
    "WorkflowError": "django_leases.exceptions",
    "UnknownWorkflowError": "django_leases.exceptions",
    "UnknownScheduleError": "django_leases.exceptions",
    "WorkflowStepFailedError": "django_leases.exceptions",
    "WorkflowStepSupersededError": "django_leases.exceptions",
    "WorkflowStepCancelledError": "django_leases.exceptions",
    "WorkflowRunStateError": "django_leases.exceptions",
    "WorkflowEventTimeout": "django_leases.exceptions",
    "WorkflowEventRefusedError": "django_leases.exceptions",
    "WorkflowChildFailedError": "django_leases.exceptions",
    "WorkflowStepTimedOutError": "django_leases.exceptions",
    "WorkflowDeadlineExceeded": "django_leases.exceptions",
    "WorkflowFunctionsMissing": "django_leases.exceptions",
    "QueueConfigError": "django_leases.exceptions",
    "StepNotIdempotentError": "django_leases.exceptions",
}

# A literal list, so type checkers see what the package exports (the lazy imports
# below are only for them); tests/test_typing.py keeps it equal to _LAZY.
__all__ = [
    "QueueConfigError",
    "RunContext",
    "StepContext",
    "StepNotIdempotentError",
    "UnknownScheduleError",
    "UnknownWorkflowError",
    "Worker",
    "WorkflowChildFailedError",
    "WorkflowDeadlineExceeded",
    "WorkflowError",
    "WorkflowEventRefusedError",
    "WorkflowEventTimeout",
    "WorkflowFunctionsMissing",
    "WorkflowRunStateError",
    "WorkflowStepCancelledError",
    "WorkflowStepFailedError",
    "WorkflowStepSupersededError",
    "WorkflowStepTimedOutError",
    "asend_event",
    "astart_workflow",
    "execute_step",
    "fork_run",
    "run_pass",
    "send_event",
    "start_workflow",
    "step_function",
    "workflow",
]

if TYPE_CHECKING:  # pragma: no cover
    from django_leases.exceptions import (
        QueueConfigError,
        StepNotIdempotentError,
        UnknownScheduleError,
        UnknownWorkflowError,
        WorkflowChildFailedError,
        WorkflowDeadlineExceeded,
        WorkflowError,
        WorkflowEventRefusedError,
        WorkflowEventTimeout,
        WorkflowFunctionsMissing,
        WorkflowRunStateError,
        WorkflowStepCancelledError,
        WorkflowStepFailedError,
        WorkflowStepSupersededError,
        WorkflowStepTimedOutError,
    )
    from django_leases.workflows.driver import RunContext, run_pass
    from django_leases.workflows.engine import (
        StepContext,
        asend_event,
        astart_workflow,
        execute_step,
        send_event,
        start_workflow,
    )
    from django_leases.workflows.operators import fork_run
    from django_leases.workflows.registry import step_function, workflow
    from django_leases.workflows.worker import Worker


__getattr__ = lazy_attributes(__name__, _LAZY)
