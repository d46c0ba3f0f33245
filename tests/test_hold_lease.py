"""``hold_lease`` / ``ahold_lease`` beyond the conformance rules: decorators, cancellation."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync

from django_leases import LeaseLostError, ahold_lease, hold_lease
from django_leases.models import Lease, LeaseQuerySet
from tests.helpers import renewal_threads, unique_key, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_hold_lease_refuses_to_decorate_a_coroutine_function() -> None:
    with pytest.raises(TypeError, match="use ahold_lease"):

        @hold_lease(unique_key("hold"), 60)
        async def body() -> None: ...


def test_ahold_lease_decorates_coroutine_functions() -> None:
    key = unique_key("hold")
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

        @ahold_lease(unique_key("hold"), 60)
        def body() -> None: ...


def test_cancelled_while_acquiring_gives_the_lease_back() -> None:
    """A task cancelled while its acquire is in flight must not leave the lease held (and
    renewed forever) by nobody."""
    key = unique_key("hold")
    real_acquire = LeaseQuerySet.acquire
    acquiring, cancelled = threading.Event(), threading.Event()

    def acquire_once_cancelled(queryset: LeaseQuerySet, *args: Any, **kwargs: Any) -> Any:
        acquiring.set()
        assert cancelled.wait(60), "the task was never cancelled"
        return real_acquire(queryset, *args, **kwargs)

    ran: list[bool] = []

    async def scenario() -> None:
        async def body() -> None:
            async with ahold_lease(key, 60):
                ran.append(True)

        task = asyncio.ensure_future(body())
        await asyncio.to_thread(acquiring.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled.set()  # only now does the acquisition in flight go on

    with mock.patch.object(LeaseQuerySet, "acquire", acquire_once_cancelled):
        async_to_sync(scenario)()  # returns as soon as the task is cancelled
        assert ran == []
        # The acquisition finishes in its thread, which then gives the lease back.
        wait_until(
            lambda: Lease.objects.filter(key=key, released_at__isnull=False).exists(),
            60,
            what="the lease to be given back",
        )
    assert Lease.objects.current(key) is None
    # No renewal was left running: nothing can extend the lease behind our back.
    wait_until(lambda: not renewal_threads(key), 60, what="no renewal thread for the key")
    assert Lease.objects.current(key) is None


def test_body_swallowing_the_cancellation_still_gets_lease_lost_error() -> None:
    """A body that catches the cancellation and returns is still not vouched for, and the
    task is not left with a pending cancellation."""
    key = unique_key("hold")
    cancelling: list[int] = []
    swallowed: list[bool] = []

    async def scenario() -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            # A short TTL: the renewal thread sees the loss (its subject) within a second.
            async with ahold_lease(key, 1.0) as held:
                await asyncio.to_thread(Lease.objects.release, held.lease)
                await asyncio.to_thread(Lease.objects.acquire, key, "other", 60)
                try:
                    await asyncio.sleep(60)  # until the renewal thread cancels the body
                except asyncio.CancelledError:
                    swallowed.append(True)
        finally:
            cancelling.append(task.cancelling())

    with pytest.raises(LeaseLostError):
        async_to_sync(scenario)()
    assert swallowed == [True], "the loss did not cancel the body"
    assert cancelling == [0]
    current = Lease.objects.current(key)
    assert current is not None and current.holder == "other"


def test_hold_lease_refuses_to_run_inside_an_atomic_block() -> None:
    """A lease taken inside an uncommitted transaction protects nothing: refuse it up front."""
    from django.db import transaction

    with (
        transaction.atomic(),
        pytest.raises(RuntimeError, match=r"inside transaction\.atomic"),
        hold_lease(unique_key("atomic"), 60),
    ):
        pytest.fail("the body ran")
    assert not Lease.objects.filter(key__startswith="atomic:").exists()


def test_force_release_reports_its_own_release_even_if_the_key_is_retaken() -> None:
    key = unique_key("force")
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
