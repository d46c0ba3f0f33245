"""Errors raised by django-leases.

Every lease error carries the ``key`` it is about and names it in its message.
"""

from __future__ import annotations


class LeaseError(Exception):
    """Base class of the lease errors; ``.key`` is the lease key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class LeaseTakenError(LeaseError):
    """The key is held, live, by another holder (``hold_lease`` never waits)."""

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Lease {key!r} is held by another holder")


class LeaseLostError(LeaseError):
    """The lease lapsed or passed to another holder before the body finished.

    Raised by ``hold_lease`` / ``ahold_lease`` when it cannot vouch that the body
    ran alone, by ``LeaseHandle.check()`` once the loss is seen, and by
    ``Lease.objects.fenced()`` when the lease is no longer held.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Lease {key!r} was lost before the body finished")


class WorkflowStepSupersededError(Exception):
    """A step write came from an attempt that a newer claim has replaced.

    Nothing was written. ``.step_id`` and ``.attempt`` name the refused write,
    ``.current_attempt`` the attempt that owns the step now (``None`` if unknown).
    """

    def __init__(self, step_id: object, attempt: int, current_attempt: int | None = None) -> None:
        detail = f" (current attempt is {current_attempt})" if current_attempt is not None else ""
        super().__init__(
            f"Attempt {attempt} of step {step_id} was superseded{detail}; its write was refused"
        )
        self.step_id = step_id
        self.attempt = attempt
        self.current_attempt = current_attempt
