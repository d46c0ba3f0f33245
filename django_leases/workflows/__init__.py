"""Durable workflows whose steps run under fenced leases (DESIGN §5).

Public API (imported lazily)::

    from django_leases.workflows import workflow, step_function, start_workflow
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "workflow": "django_leases.workflows.registry",
    "step_function": "django_leases.workflows.registry",
    "start_workflow": "django_leases.workflows.engine",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_leases.workflows' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
