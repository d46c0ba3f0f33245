"""Errors of trigger sources: the store's, and the receiver's (each with its HTTP status)."""

from __future__ import annotations


class UnknownTriggerSourceError(LookupError):
    """No ``TriggerSource`` row has that name. ``.name`` is the name asked for."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown trigger source: {name!r}")
        self.name = name


class ReceiveError(Exception):
    """A delivery was refused; ``.status`` is the HTTP status to answer, nothing was recorded.

    The message is safe to send back to the sender: it never holds a secret.
    """

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SourceNotReceiving(ReceiveError):
    """Unknown, orphaned (no longer declared) or disabled source: 404."""

    status = 404


class PayloadTooLarge(ReceiveError):
    """The body is over ``DJANGO_LEASES["WEBHOOK_MAX_BODY"]``: 413."""

    status = 413


class SignatureMismatch(ReceiveError):
    """The signature header is missing or does not sign the body with the secret: 401."""

    status = 401


class MalformedDelivery(ReceiveError, ValueError):
    """Signed, but not a delivery we can read (body, event or delivery id): 400."""

    status = 400


class TriggerSourceError(Exception):
    """A trigger-source operation was refused before anything changed. ``.name`` is the source.

    The message is meant for operators (the admin's message, a command's stderr) and never
    holds a secret.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class SourceStillDeclared(TriggerSourceError):
    """``forget`` of a source that is still declared in code (only orphans are forgotten)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            f"Trigger source {name!r} is still declared in code; only an orphan can be "
            "forgotten (disable it instead, or remove its declaration and reconcile first)",
        )
