"""Argument checks shared by every public entry point (one place for each rule)."""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal
from numbers import Real

from django_leases.conf import leases_settings

#: Longest key or holder accepted, in characters (the column width).
MAX_KEY_LENGTH = 255

#: Shortest TTL accepted, in seconds: the database clock is read to the millisecond.
MIN_TTL = 0.001


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a usable lease key or holder, else raise ``ValueError``.

    A usable name is a non-empty ``str`` of at most 255 characters, without NUL and without
    lone surrogates (neither PostgreSQL nor SQLite can store them). Longer names are
    refused, never truncated.
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
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"Lease {what} must be valid Unicode text (it contains a lone surrogate)"
            ) from None
    return value


def ttl_seconds(ttl: object) -> float:
    """Return a TTL given as ``timedelta`` or seconds (a real number) as float seconds.

    Raises ``ValueError`` for anything else (``bool`` and strings included), for
    ``ttl <= 0``, for NaN/infinity, for a TTL shorter than :data:`MIN_TTL` (1 ms, the
    database clock's resolution) and for a TTL longer than ``DJANGO_LEASES["MAX_TTL"]``
    (366 days by default).
    """
    if isinstance(ttl, timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, bool) or not isinstance(ttl, Real | Decimal):
        raise ValueError(
            f"Lease ttl must be a timedelta or a number of seconds, not {type(ttl).__name__}"
        )
    else:
        try:
            seconds = float(ttl)
        except OverflowError:
            seconds = math.inf if ttl > 0 else -math.inf  # type: ignore[operator]
    if not math.isfinite(seconds):
        raise ValueError(f"Lease ttl must be a finite number of seconds, got {ttl!r}")
    if seconds <= 0:
        raise ValueError(f"Lease ttl must be greater than 0 seconds, got {seconds:g}")
    if seconds < MIN_TTL:
        raise ValueError(f"Lease ttl must be at least {MIN_TTL:g} seconds, got {seconds:g}")
    limit = float(leases_settings.MAX_TTL)
    if seconds > limit:
        raise ValueError(f"Lease ttl of {seconds!r} s is longer than the limit of {limit!r} s")
    return seconds


def renewable_ttl_seconds(ttl: object) -> float:
    """:func:`ttl_seconds` for a lease that is kept alive by renewals (``hold_lease``, the
    ``hold_lease`` command): also refuses a TTL shorter than three renewal intervals at the
    shortest interval (``3 × DJANGO_LEASES["RENEWAL_FLOOR"]``, 0.15 s by default), since
    such a lease would lapse before its first renewal. Raises ``ValueError``.
    """
    seconds = ttl_seconds(ttl)
    shortest = round(3 * float(leases_settings.RENEWAL_FLOOR), 6)
    if seconds < shortest:
        raise ValueError(
            f"A renewed lease needs a ttl of at least {shortest!r} s "
            f"(three renewals at the shortest interval), got {seconds!r}"
        )
    return seconds
