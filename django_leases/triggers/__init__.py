"""Webhook trigger sources (DESIGN §6).

Public API (imported lazily, so importing this package touches no model)::

    from django_leases.triggers import webhook_source, StartWorkflow, Delivery
    from django_leases.triggers import enable, disable, reconcile, teardown, forget
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "webhook_source": "django_leases.triggers.registry",
    "StartWorkflow": "django_leases.triggers.registry",
    "Delivery": "django_leases.triggers.registry",
    "TriggerDeclaration": "django_leases.triggers.registry",
    "declarations": "django_leases.triggers.registry",
    "get_declaration": "django_leases.triggers.registry",
    "github_signature": "django_leases.triggers.signatures",
    "verify_github_signature": "django_leases.triggers.signatures",
    "stripe_signature": "django_leases.triggers.signatures",
    "verify_stripe_signature": "django_leases.triggers.signatures",
    "UnknownTriggerSourceError": "django_leases.triggers.errors",
    "reconcile": "django_leases.triggers.lifecycle",
    "enable": "django_leases.triggers.lifecycle",
    "disable": "django_leases.triggers.lifecycle",
    "teardown": "django_leases.triggers.lifecycle",
    "forget": "django_leases.triggers.lifecycle",
    "LifecycleResult": "django_leases.triggers.lifecycle",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_leases.triggers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
