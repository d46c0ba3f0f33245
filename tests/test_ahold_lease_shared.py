"""``ahold_lease`` shared by the tasks of one async context: a waiter leaves the context's
one sync thread free for the holder's release, and one object entered twice at once is
refused while the first hold keeps its protection."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync

from django_leases import LeaseLostError, ahold_lease
from django_leases.exceptions import LeaseTakenError, MisuseError
from django_leases.models import Lease
from tests.helpers import closing_connections, unique_key

# -- ahold_lease ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_waiting_ahold_lease_lets_the_holder_in_its_context_release() -> None:
    """Two tasks of one async context (one request, one ``async_to_sync``, one
    ``asyncio.run``): the first holds the key for 0.3 s, the second waits for it up to 5 s.
    The waiter pauses on the event loop between tries (each try one short call on the
    context's one sync thread), so the holder's release gets that thread and the waiter has
    the key some 0.3 s in. (Before, the whole wait was one call on that thread: the release
    queued behind it, the waiter failed after its full wait, and ``wait=math.inf``
    deadlocked.)"""
    key = unique_key("async-wait")
    outcome: dict[str, object] = {}

    async def holder() -> None:
        async with ahold_lease(key, 30):
            await asyncio.sleep(0.3)
        outcome["holder_out"] = time.monotonic()

    async def waiter() -> None:
        await asyncio.sleep(0.05)  # the holder has the key by now
        started = time.monotonic()
        try:
            async with ahold_lease(key, 30, wait=5):
                outcome["waited"] = time.monotonic() - started
        except LeaseTakenError:
            outcome["waited"] = "LeaseTakenError after %.1f s" % (time.monotonic() - started)

    async def both() -> None:
        await asyncio.gather(holder(), waiter())

    async_to_sync(both)()
    waited = outcome["waited"]
    assert isinstance(waited, float) and waited < 3, f"the waiter got: {waited}"


@pytest.mark.django_db(transaction=True)
def test_one_ahold_lease_entered_twice_at_once_is_refused_and_keeps_its_holder_safe() -> None:
    """One ``ahold_lease`` object entered by a second task while the first is still acquiring
    (``lock = ahold_lease(...)`` shared by concurrent requests) is refused with
    ``MisuseError``, as a nested reuse is, and leaves the first hold as it was: its body is
    still cancelled when its lease is lost. (Before, the guard looked only at a hold already
    acquired: the second entry overwrote the task to cancel, and the first body ran on
    unprotected until it ended by itself.)"""
    key = unique_key("async-shared")
    shared = ahold_lease(key, 1.0)  # renewed every 1/3 s: a loss is seen within a second
    outcome: dict[str, object] = {}

    async def first() -> None:
        try:
            async with shared as held:
                await asyncio.sleep(0.2)  # the second entry has come and gone
                # Another holder takes the key: this hold is lost.
                await asyncio.to_thread(closing_connections(Lease.objects.release), held.lease)
                await asyncio.to_thread(closing_connections(Lease.objects.acquire), key, "x", 60)
                started = time.monotonic()
                try:
                    await asyncio.sleep(5)
                finally:
                    outcome["body_ran_on"] = time.monotonic() - started
        except LeaseLostError:
            outcome["first"] = "LeaseLostError"

    async def second() -> None:
        try:
            async with shared:
                outcome["second"] = "entered"
        except Exception as exc:
            outcome["second"] = type(exc).__name__

    async def both() -> None:
        await asyncio.gather(first(), second())

    async_to_sync(both)()
    assert outcome["first"] == "LeaseLostError"
    assert outcome["second"] == MisuseError.__name__, outcome
    assert outcome["body_ran_on"] < 3, f"the lost body was not cancelled: {outcome}"
