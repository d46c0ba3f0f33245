"""Time-ordered identifiers for rows that are inserted all the time (workflow runs).

A random (version 4) UUID primary key sends every insert to a random leaf page of the
primary-key B-tree and of every index that carries the id: at a million kept runs most of
those pages are no longer in memory, each insert dirties a cold page, and the write-ahead log
fills with full-page images. A version 7 UUID (RFC 9562) starts with the Unix time in
milliseconds, so new ids land on the right-hand edge of the index, as a serial key would,
while staying unguessable enough (74 random bits) and globally unique without a sequence.

Python 3.14 ships :func:`uuid.uuid7`; before that, :func:`uuid7` here builds the same layout.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

__all__ = ["uuid7"]

_VERSION = 0x7
_VARIANT = 0b10

# Within one millisecond, the 12 bits after the version field count up from a random start
# (RFC 9562 §6.2, method 1: a counter in rand_a), so ids made by one process are strictly
# increasing; when the counter runs out the millisecond field is borrowed forward by one.
_COUNTER_BITS = 12
_COUNTER_MAX = (1 << _COUNTER_BITS) - 1
_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock would leave the child's copy held for good.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _fallback_uuid7() -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix milliseconds, version, a 12-bit per-millisecond
    counter, variant, 62 random bits. Strictly increasing within this process."""
    global _last_ms, _counter
    now_ms = time.time_ns() // 1_000_000
    with _lock:
        if now_ms > _last_ms:
            _last_ms = now_ms
            # Start low in the counter's range so a burst in one millisecond rarely overflows.
            _counter = int.from_bytes(os.urandom(2)) & (_COUNTER_MAX >> 1)
        else:
            _counter += 1
            if _counter > _COUNTER_MAX:
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand_b = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | _VERSION << 76 | counter << 64 | _VARIANT << 62 | rand_b
    return uuid.UUID(int=value)


_native: Callable[[], uuid.UUID] | None = getattr(uuid, "uuid7", None)


def uuid7() -> uuid.UUID:
    """A new time-ordered (version 7) UUID.

    Returns :class:`uuid.UUID`: ``uuid.uuid7()`` where Python provides it (3.14+), otherwise
    the same RFC 9562 layout built here — the first 48 bits are the Unix time in milliseconds,
    so ids sort by creation time across processes (to the millisecond; strictly increasing
    within one process). Raises nothing.
    """
    if _native is not None:
        return _native()
    return _fallback_uuid7()
