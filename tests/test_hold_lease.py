"""``hold_lease`` / ``ahold_lease`` beyond the conformance rules: decorators, cancellation."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync

from django_leases import LeaseLostError, ahold_lease, hold_lease
from django_leases.exceptions import MisuseError
from django_leases.models import Lease, LeaseQuerySet
from tests.helpers import (
    held_renewals,
    on_another_thread,
    race,
    race_in_processes,
    take_over,
    unique_key,
    wait_until,
)

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
    wait_until(lambda: not held_renewals(key), 60, what="nothing renewing the key")
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
                await take_over(held, key)
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
        pytest.raises(MisuseError, match=r"inside transaction\.atomic"),
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


def _hold_as_cron(key: str, ready: Any, inside: Any, refused: Any) -> str:
    """One ``hold_lease(key, holder="cron")``, released by ``ready`` (a barrier). Its body
    stays in until the other hold is in too (``inside`` reaches 2: both held) or was refused
    (``refused`` set). Returns ``"both"``, ``"held"`` or ``"refused"``."""
    from django_leases import LeaseTakenError

    ready.wait(60)
    try:
        with hold_lease(key, ttl=30, holder="cron"):
            with inside.get_lock():
                inside.value += 1
            while not refused.is_set():
                if inside.value == 2:
                    return "both"
                refused.wait(0.05)  # polls the two events; nothing is timed
            return "held"
    except LeaseTakenError:
        refused.set()
        return "refused"


def _same_holder_name_race(run: Callable[..., Any], key: str) -> list[Any]:
    fork = multiprocessing.get_context("fork")
    ready, inside, refused = fork.Barrier(2), fork.Value("i", 0), fork.Event()
    return run(*[lambda: _hold_as_cron(key, ready, inside, refused) for _ in range(2)])


def test_two_holds_given_the_same_holder_name_on_two_threads_exclude_each_other() -> None:
    key = unique_key("same-holder")
    outcomes = _same_holder_name_race(lambda *calls: race(list(calls)), key)
    assert "both" not in outcomes, f"both holds held the key: {outcomes}"
    assert {outcomes[0], outcomes[1]} == {"held", "refused"}, outcomes
    assert Lease.objects.get(key=key).token == 1


def test_two_holds_given_the_same_holder_name_in_two_processes_exclude_each_other() -> None:
    key = unique_key("same-holder")
    outcomes = _same_holder_name_race(race_in_processes, key)
    assert ("both", "") not in outcomes, f"both holds held the key: {outcomes}"
    assert {outcomes[0], outcomes[1]} == {("held", ""), ("refused", "")}, outcomes
    assert Lease.objects.get(key=key).token == 1


def test_a_holder_name_leaves_room_for_the_hold_s_own_suffix() -> None:
    from django_leases.leases import MAX_HOLDER_NAME_LENGTH

    key = unique_key("hold")
    with hold_lease(key, 30, holder="h" * MAX_HOLDER_NAME_LENGTH) as held:
        assert len(held.holder) == 255
        assert held.holder.startswith("h" * MAX_HOLDER_NAME_LENGTH + ":")
    with pytest.raises(ValueError, match=r"Lease holder .*the limit is 238"):
        hold_lease(key, 30, holder="h" * (MAX_HOLDER_NAME_LENGTH + 1))
    assert Lease.objects.get(key=key).token == 1


def test_a_wait_stopped_while_it_sleeps_does_not_take_the_lease() -> None:
    """``stop()`` turning true during a back-off pause (an ``ahold_lease`` waiter cancelled
    meanwhile) ends the wait: the key, given up during that pause, is not taken."""
    from django_leases import LeaseTakenError
    from django_leases.leases import HeldLease

    key = unique_key("stopped-wait")
    other = Lease.objects.acquire(key, "other", 30)
    assert other is not None
    asked: list[bool] = []

    def stop() -> bool:  # false when asked before the first pause, true once asked after it
        asked.append(bool(asked))
        return asked[-1]

    def observe(event: str, error: BaseException | None) -> None:
        if event == "taken":  # the other holder gives the key up before the next try
            on_another_thread(lambda: Lease.objects.release(other))

    held = HeldLease(key, 30)
    with pytest.raises(LeaseTakenError):
        held.acquire(wait=60, stop=stop, observe=observe)
    assert not held.acquired
    assert Lease.objects.get(key=key).token == other.token, "a stopped wait took the lease"
    assert Lease.objects.current(key) is None


def test_hold_lease_and_ahold_lease_refuse_to_decorate_generator_functions() -> None:
    """Calling a generator function only makes the generator: a decorator's hold would be
    acquired and released before the first line of the body ran, the whole body unprotected
    (two nodes iterating at once). Both refuse at decoration, as ``hold_lease`` refuses a
    coroutine function."""
    from django_leases import ahold_lease

    def produce() -> Iterator[int]:
        yield 1

    async def aproduce() -> AsyncIterator[int]:
        yield 1

    for decorator, func in (
        (hold_lease("gen", ttl=30), produce),
        (hold_lease("gen", ttl=30), aproduce),
        (ahold_lease("gen", ttl=30), aproduce),
    ):
        with pytest.raises(TypeError, match="generator function"):
            decorator(func)  # type: ignore[arg-type]
