"""Webhook trigger sources (DESIGN §6).

Public API (imported lazily, so importing this package touches no model)::

    from django_leases.triggers import webhook_source, StartWorkflow, SendEvent, Delivery
    from django_leases.triggers import enable, disable, reconcile, teardown, forget

The trigger-source errors (``TriggerSourceError`` and the others of
:mod:`django_leases.exceptions`) are here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_leases import lazy_attributes

_LAZY = {
    "webhook_source": "django_leases.triggers.registry",
    "StartWorkflow": "django_leases.triggers.registry",
    "SendEvent": "django_leases.triggers.registry",
    "run_for_key": "django_leases.triggers.registry",
    "Delivery": "django_leases.triggers.values",
    "Handled": "django_leases.triggers.values",
    "TriggerDeclaration": "django_leases.triggers.registry",
    "declarations": "django_leases.triggers.registry",
    "get_declaration": "django_leases.triggers.registry",
    "github_signature": "django_leases.triggers.signatures",
    "verify_github_signature": "django_leases.triggers.signatures",
    "stripe_signature": "django_leases.triggers.signatures",
    "verify_stripe_signature": "django_leases.triggers.signatures",
    "reconcile": "django_leases.triggers.lifecycle",
    "enable": "django_leases.triggers.lifecycle",
    "disable": "django_leases.triggers.lifecycle",
    "teardown": "django_leases.triggers.lifecycle",
    "forget": "django_leases.triggers.lifecycle",
    "LifecycleResult": "django_leases.triggers.lifecycle",
    "TriggerSourceError": "django_leases.exceptions",
    "UnknownTriggerSourceError": "django_leases.exceptions",
    "SourceStillDeclared": "django_leases.exceptions",
    "SourceOrphaned": "django_leases.exceptions",
    "NoAddress": "django_leases.exceptions",
    "ProviderNotInstalled": "django_leases.exceptions",
    "NoReceiveURL": "django_leases.exceptions",
    "SourceBusy": "django_leases.exceptions",
    "ProviderError": "django_leases.exceptions",
    "CredentialError": "django_leases.exceptions",
    "ReceiveError": "django_leases.exceptions",
    "SourceNotReceiving": "django_leases.exceptions",
    "SourceNotDeclaredHere": "django_leases.exceptions",
    "PayloadTooLarge": "django_leases.exceptions",
    "SignatureMismatch": "django_leases.exceptions",
    "MalformedDelivery": "django_leases.exceptions",
}

# A literal list, so type checkers see what the package exports (the lazy imports
# below are only for them); tests/test_typing.py keeps it equal to _LAZY.
__all__ = [
    "CredentialError",
    "Delivery",
    "Handled",
    "LifecycleResult",
    "MalformedDelivery",
    "NoAddress",
    "NoReceiveURL",
    "PayloadTooLarge",
    "ProviderError",
    "ProviderNotInstalled",
    "ReceiveError",
    "SendEvent",
    "SignatureMismatch",
    "SourceBusy",
    "SourceNotDeclaredHere",
    "SourceNotReceiving",
    "SourceOrphaned",
    "SourceStillDeclared",
    "StartWorkflow",
    "TriggerDeclaration",
    "TriggerSourceError",
    "UnknownTriggerSourceError",
    "declarations",
    "disable",
    "enable",
    "forget",
    "get_declaration",
    "github_signature",
    "reconcile",
    "run_for_key",
    "stripe_signature",
    "teardown",
    "verify_github_signature",
    "verify_stripe_signature",
    "webhook_source",
]

if TYPE_CHECKING:  # pragma: no cover
    from django_leases.exceptions import (
        CredentialError,
        MalformedDelivery,
        NoAddress,
        NoReceiveURL,
        PayloadTooLarge,
        ProviderError,
        ProviderNotInstalled,
        ReceiveError,
        SignatureMismatch,
        SourceBusy,
        SourceNotDeclaredHere,
        SourceNotReceiving,
        SourceOrphaned,
        SourceStillDeclared,
        TriggerSourceError,
        UnknownTriggerSourceError,
    )
    from django_leases.triggers.lifecycle import (
        LifecycleResult,
        disable,
        enable,
        forget,
        reconcile,
        teardown,
    )
    from django_leases.triggers.registry import (
        SendEvent,
        StartWorkflow,
        TriggerDeclaration,
        declarations,
        get_declaration,
        run_for_key,
        webhook_source,
    )
    from django_leases.triggers.signatures import (
        github_signature,
        stripe_signature,
        verify_github_signature,
        verify_stripe_signature,
    )
    from django_leases.triggers.values import Delivery, Handled


__getattr__ = lazy_attributes(__name__, _LAZY)
