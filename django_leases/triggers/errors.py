"""The trigger-source errors, where they were importable before
:mod:`django_leases.exceptions` held every error of the package (the receiver's with their
HTTP status)."""

from __future__ import annotations

from django_leases.exceptions import (
    MalformedDelivery,
    PayloadTooLarge,
    ReceiveError,
    SignatureMismatch,
    SourceNotReceiving,
    SourceStillDeclared,
    TriggerSourceError,
    UnknownTriggerSourceError,
)

__all__ = [
    "MalformedDelivery",
    "PayloadTooLarge",
    "ReceiveError",
    "SignatureMismatch",
    "SourceNotReceiving",
    "SourceStillDeclared",
    "TriggerSourceError",
    "UnknownTriggerSourceError",
]
