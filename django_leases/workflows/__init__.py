"""Durable workflows whose steps run under fenced leases (DESIGN §5).

Public API (imported lazily)::

    from django_leases.workflows import workflow, step_function, start_workflow

``Worker`` (the worker threads), ``execute_step`` / ``run_pass`` (one unit of work each) and
``WorkflowStepFailedError`` (raised by ``run.step`` for a step out of attempts) are here too.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "workflow": "django_leases.workflows.registry",
    "step_function": "django_leases.workflows.registry",
    "UnknownWorkflowError": "django_leases.workflows.registry",
    "start_workflow": "django_leases.workflows.engine",
    "execute_step": "django_leases.workflows.engine",
    "run_pass": "django_leases.workflows.engine",
    "WorkflowStepFailedError": "django_leases.workflows.engine",
    "Worker": "django_leases.workflows.worker",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_leases.workflows' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
