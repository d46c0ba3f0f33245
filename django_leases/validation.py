"""Argument checks shared by every public entry point (one place for each rule)."""

from __future__ import annotations

import math
from datetime import timedelta

from django_leases.conf import leases_settings

#: Longest key or holder accepted, in characters (the column width).
MAX_KEY_LENGTH = 255


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a usable lease key or holder, else raise ``ValueError``.

    A usable name is a non-empty ``str`` of at most 255 characters without NUL. Longer
    names are refused, never truncated.
    """
    if not isinstance(value, str):
        raise ValueError(f"Lease {what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"Lease {what} must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise ValueError(
            f"Lease {what} is {len(value)} characters long; the limit is {MAX_KEY_LENGTH}"
        )
    if "\x00" in value:
        raise ValueError(f"Lease {what} must not contain a NUL character")
    return value


def ttl_seconds(ttl: object) -> float:
    """Return a TTL given as ``timedelta`` or seconds (int/float) as float seconds.

    Raises ``ValueError`` for anything else, for ``ttl <= 0``, for NaN/infinity and
    for a TTL longer than ``DJANGO_LEASES["MAX_TTL"]`` (366 days by default).
    """
    if isinstance(ttl, timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise ValueError(
            f"Lease ttl must be a timedelta or a number of seconds, not {type(ttl).__name__}"
        )
    else:
        seconds = float(ttl)
    if not math.isfinite(seconds):
        raise ValueError(f"Lease ttl must be finite, got {ttl!r}")
    if seconds <= 0:
        raise ValueError(f"Lease ttl must be greater than 0 seconds, got {seconds:g}")
    limit = float(leases_settings.MAX_TTL)
    if seconds > limit:
        raise ValueError(f"Lease ttl of {seconds:g} s is longer than the limit of {limit:g} s")
    return seconds
