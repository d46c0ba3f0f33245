"""Coordination primitives for Django, backed by your own database.

Leases with fencing tokens, fenced workflow steps and webhook trigger sources.
The public API is imported lazily so importing the package never touches models
before the app registry is ready::

    from django_leases import hold_lease, LeaseLostError
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "hold_lease": "django_leases.leases",
    "ahold_lease": "django_leases.leases",
    "HeldLease": "django_leases.leases",
    "LeaseHandle": "django_leases.leases",
    "DjangoLeasesError": "django_leases.exceptions",
    "LeaseError": "django_leases.exceptions",
    "LeaseTakenError": "django_leases.exceptions",
    "LeaseLostError": "django_leases.exceptions",
    "WorkflowStepSupersededError": "django_leases.exceptions",
}

# A literal list, so type checkers see what the package exports (the lazy imports
# below are only for them); tests/test_typing.py keeps it equal to _LAZY.
__all__ = [
    "DjangoLeasesError",
    "HeldLease",
    "LeaseError",
    "LeaseHandle",
    "LeaseLostError",
    "LeaseTakenError",
    "WorkflowStepSupersededError",
    "__version__",
    "ahold_lease",
    "hold_lease",
]

if TYPE_CHECKING:  # pragma: no cover
    from django_leases.exceptions import (
        DjangoLeasesError,
        LeaseError,
        LeaseLostError,
        LeaseTakenError,
        WorkflowStepSupersededError,
    )
    from django_leases.leases import HeldLease, LeaseHandle, ahold_lease, hold_lease


def lazy_attributes(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``table`` (name →
    module) from its module on first access, so importing the package touches no model."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__


__getattr__ = lazy_attributes(__name__, _LAZY)
