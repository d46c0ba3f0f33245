"""``hold_lease`` / ``ahold_lease`` beyond the conformance rules: decorators, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync

from django_leases import LeaseLostError, ahold_lease, hold_lease
from django_leases.models import Lease, LeaseQuerySet

pytestmark = pytest.mark.django_db(transaction=True)


def _key() -> str:
    return f"hold:{uuid.uuid4().hex[:12]}"


def _renewal_threads(key: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"lease-renewal:{key}"]


def test_hold_lease_refuses_to_decorate_a_coroutine_function() -> None:
    with pytest.raises(TypeError, match="use ahold_lease"):

        @hold_lease(_key(), 60)
        async def body() -> None: ...


def test_ahold_lease_decorates_coroutine_functions() -> None:
    key = _key()
    seen: list[int] = []

    @ahold_lease(key, 60)
    async def body(value: int) -> int:
        current = await asyncio.to_thread(lambda: None)  # noqa: F841 - yield to the loop
        seen.append(value)
        return value * 2

    assert async_to_sync(body)(21) == 42
    assert async_to_sync(body)(1) == 2
    assert seen == [21, 1]
    # Two calls, two holdings: token 2, and the key is free again.
    assert Lease.objects.get(key=key).token == 2
    assert Lease.objects.current(key) is None


def test_ahold_lease_refuses_to_decorate_a_plain_function() -> None:
    with pytest.raises(TypeError, match="use hold_lease"):

        @ahold_lease(_key(), 60)
        def body() -> None: ...


def test_cancelled_while_acquiring_gives_the_lease_back() -> None:
    """A task cancelled while its acquire is in flight must not leave the lease held (and
    renewed forever) by nobody."""
    key = _key()
    real_acquire = LeaseQuerySet.acquire
    acquiring = threading.Event()

    def slow_acquire(queryset: LeaseQuerySet, *args: Any, **kwargs: Any) -> Any:
        acquiring.set()
        time.sleep(0.5)
        return real_acquire(queryset, *args, **kwargs)

    ran: list[bool] = []

    async def scenario() -> None:
        async def body() -> None:
            async with ahold_lease(key, 1.0):
                ran.append(True)

        task = asyncio.ensure_future(body())
        await asyncio.to_thread(acquiring.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with mock.patch.object(LeaseQuerySet, "acquire", slow_acquire):
        async_to_sync(scenario)()  # returns as soon as the task is cancelled
    assert ran == []
    # The acquisition finishes in its thread, which then gives the lease back.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if Lease.objects.filter(key=key, released_at__isnull=False).exists():
            break
        time.sleep(0.05)
    lease = Lease.objects.get(key=key)
    assert lease.released_at is not None, "the lease was left held"
    assert Lease.objects.current(key) is None
    time.sleep(1.0)  # well past a renewal interval: nothing renews it behind our back
    assert Lease.objects.current(key) is None
    assert not _renewal_threads(key)


def test_body_swallowing_the_cancellation_still_gets_lease_lost_error() -> None:
    """A body that catches the cancellation and returns is still not vouched for, and the
    task is not left with a pending cancellation."""
    key = _key()
    cancelling: list[int] = []

    async def scenario() -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            async with ahold_lease(key, 1.0) as held:
                await asyncio.to_thread(Lease.objects.release, held.lease)
                await asyncio.to_thread(Lease.objects.acquire, key, "other", 60)
                with contextlib.suppress(asyncio.CancelledError):  # swallowed
                    await asyncio.sleep(10)
        finally:
            cancelling.append(task.cancelling())

    with pytest.raises(LeaseLostError):
        async_to_sync(scenario)()
    assert cancelling == [0]
    current = Lease.objects.current(key)
    assert current is not None and current.holder == "other"


def test_hold_lease_refuses_to_run_inside_an_atomic_block() -> None:
    """A lease taken inside an uncommitted transaction protects nothing: refuse it up front."""
    from django.db import transaction

    with (
        transaction.atomic(),
        pytest.raises(RuntimeError, match=r"inside transaction\.atomic"),
        hold_lease(f"atomic-{uuid.uuid4().hex}", 60),
    ):
        pytest.fail("the body ran")
    assert not Lease.objects.filter(key__startswith="atomic-").exists()


def test_force_release_reports_its_own_release_even_if_the_key_is_retaken() -> None:
    key = f"force-{uuid.uuid4().hex}"
    assert Lease.objects.acquire(key, "a", 60) is not None
    retake = Lease.objects.acquire
    calls: list[Any] = []

    def release_then_retake(self: LeaseQuerySet, lease: Lease) -> bool:
        released = original_release(self, lease)
        calls.append(retake(key, "b", 60))  # another holder grabs the key at once
        return released

    original_release = LeaseQuerySet.release
    with mock.patch.object(LeaseQuerySet, "release", release_then_retake):
        assert Lease.objects.force_release(key) is True
    assert calls and calls[0] is not None and calls[0].token == 2
