"""An ``ahold_lease`` whose task or event loop goes away, is cancelled twice, or nests.

The rule throughout: a lease is renewed only while a holder can still use it. A hold whose
coroutine can never run again is given back; one whose task is cancelled still releases;
a second hold of the key in the same task or thread is refused and leaves the first alone.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections

from django_leases import LeaseLostError, ahold_lease, hold_lease
from django_leases.exceptions import LeaseTakenError
from django_leases.models import Lease
from django_leases.models.lease import LeaseQuerySet
from django_leases.signals import lease_lost
from tests.helpers import (
    closing_connections,
    end_renewers,
    held_renewals,
    lapse_lease,
    on_another_thread,
    take_over,
    unique_key,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _renewers_ended(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Each test ends with the renewers' threads (and their connections) gone, and the
    connection of asgiref's shared thread closed: a loop run outside ``async_to_sync``
    runs its ``sync_to_async`` calls there."""
    yield
    end_renewers(monkeypatch)
    asyncio.run(sync_to_async(connections.close_all)())


def given_back(key: str) -> None:
    """Wait until ``key`` is released and nothing in this process renews it."""
    wait_until(
        lambda: Lease.objects.current(key) is None and not held_renewals(key),
        30,
        what=f"lease {key!r} given back and no longer renewed",
    )


async def hold_for_ever(key: str, entered: threading.Event) -> None:
    async with ahold_lease(key, 3):
        entered.set()
        await asyncio.Event().wait()


def test_a_hold_whose_loop_closed_under_it_is_given_back_once_its_task_is_collected() -> None:
    """A loop closed with a task suspended inside ``async with ahold_lease`` (a framework's
    loop torn down, a thread's loop closed at shutdown): once the task and its coroutine
    are collected, the body can never reach its release. The lease is given back then —
    before, the renewer renewed it for as long as the process lived."""
    key = unique_key("loop-closed")
    entered = threading.Event()

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(hold_for_ever(key, entered))
        loop.run_until_complete(asyncio.to_thread(entered.wait, 30))
        loop.close()  # the task never runs again
        del task
        gc.collect()

    on_another_thread(scenario)
    given_back(key)


def test_a_hold_whose_coroutine_is_closed_is_given_back() -> None:
    """``coroutine.close()`` on a body suspended inside the block (no loop to come back
    on) gives the lease back without awaiting anything."""
    key = unique_key("closed")
    entered = threading.Event()

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        coroutine = hold_for_ever(key, entered)
        task = loop.create_task(coroutine)
        loop.run_until_complete(asyncio.to_thread(entered.wait, 30))
        loop.close()
        assert Lease.objects.current(key) is not None
        coroutine.close()
        del task

    on_another_thread(closing_connections(scenario))
    given_back(key)


def test_asyncio_run_cancels_a_forgotten_hold_which_releases() -> None:
    """``asyncio.run`` cancels the tasks still running when its main coroutine returns; a
    hold open in one of them is released."""
    key = unique_key("forgotten")
    entered = threading.Event()

    async def main() -> None:
        asyncio.get_running_loop().create_task(hold_for_ever(key, entered))
        await asyncio.to_thread(entered.wait, 30)

    on_another_thread(lambda: asyncio.run(main()))
    given_back(key)


def test_a_task_cancelled_again_during_its_release_still_releases() -> None:
    """The release cannot be cut short: a task cancelled in the body, and again while its
    release is in flight, still gives the key back."""
    key = unique_key("cancel-release")
    real_release = LeaseQuerySet.release
    releasing, go = threading.Event(), threading.Event()

    def slow_release(queryset: LeaseQuerySet, *args: Any, **kwargs: Any) -> object:
        releasing.set()
        assert go.wait(60)
        return real_release(queryset, *args, **kwargs)

    async def scenario() -> None:
        entered = threading.Event()
        task = asyncio.ensure_future(hold_for_ever(key, entered))
        await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        assert await asyncio.to_thread(releasing.wait, 60)
        task.cancel()  # once more, during the release
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    with mock.patch.object(LeaseQuerySet, "release", slow_release):
        async_to_sync(scenario)()
    given_back(key)


def test_a_nested_hold_of_a_held_key_is_refused_and_spares_the_outer_one() -> None:
    """Holds do not nest by key: a ``hold_lease`` inside a hold of the same key (the same
    holder name or none, waiting or not) is refused with ``LeaseTakenError``, and the outer
    hold keeps its grant and releases it at its end."""
    key = unique_key("nested")
    with hold_lease(key, 30, holder="cron") as outer:
        with pytest.raises(LeaseTakenError), hold_lease(key, 30, holder="cron"):
            pass
        with pytest.raises(LeaseTakenError), hold_lease(key, 30, wait=0.2):
            pass
        current = Lease.objects.current(key)
        assert current is not None
        assert (current.holder, current.token) == (outer.holder, outer.token)
        outer.check()
    assert Lease.objects.current(key) is None


def test_a_nested_async_hold_of_a_held_key_is_refused() -> None:
    """The same for ``ahold_lease`` in one task."""
    key = unique_key("nested-async")
    seen: dict[str, object] = {}

    async def scenario() -> None:
        async with ahold_lease(key, 30) as held:
            with pytest.raises(LeaseTakenError):
                async with ahold_lease(key, 30):
                    pass
            current = await asyncio.to_thread(closing_connections(Lease.objects.current), key)
            seen["kept"] = current is not None and current.holder == held.holder

    async_to_sync(scenario)()
    assert seen == {"kept": True}
    assert Lease.objects.current(key) is None


def test_a_hold_that_lapsed_and_was_taken_over_learns_it_and_spares_its_successor() -> None:
    """A holder paused past its TTL whose key another took: ``lost`` is set, ``check()``
    and the block's end raise ``LeaseLostError``, and its release leaves the successor's
    grant alone."""
    key = unique_key("lapsed")
    with pytest.raises(LeaseLostError), hold_lease(key, 3) as held:
        lapse_lease(key)
        successor = Lease.objects.acquire(key, "successor", 60)
        assert successor is not None and successor.token > held.token
        assert held.lost.wait(10), "the lapsed hold was never told"
        with pytest.raises(LeaseLostError):
            held.check()
    current = Lease.objects.current(key)
    assert current is not None and current.holder == "successor"
    assert Lease.objects.refresh(current, 60) is not None


def test_a_holder_resumed_past_its_local_deadline_learns_it_at_its_first_check() -> None:
    """A holder paused past its TTL (SIGSTOP, a long GC, a suspended VM) can no longer vouch
    for its lease when it resumes, and its first ``check()`` says so — also when the body's
    thread runs before the watchdog's, which has not yet woken to mark it lost. Here the
    pause is its effect alone: the local deadline is in the past and the watchdog asleep."""
    key = unique_key("resumed")
    told: list[str] = []

    def receiver(sender: object, key: str, **kwargs: object) -> None:
        told.append(key)

    lease_lost.connect(receiver, dispatch_uid=key)
    try:
        with pytest.raises(LeaseLostError), hold_lease(key, 30) as held:
            renewal = held._renewal
            assert renewal is not None
            with renewal.renewer.cond:  # moved without waking the watchdog (due in 30 s)
                renewal._deadline = time.monotonic() - 1
            with pytest.raises(LeaseLostError):
                held.check()
            assert held.lost.is_set()
            # Told once: by this check, or by the watchdog if another lease woke it first.
            wait_until(lambda: told == [key], 10, what="lease_lost sent once")
    finally:
        lease_lost.disconnect(dispatch_uid=key)


def test_an_async_generator_closed_on_its_loop_has_released_when_aclose_returns() -> None:
    """A hold inside an async generator (a streamed response whose client went away) closed
    with ``aclose()`` on its running loop exits as any body does: the release is awaited, so
    the key is free by the time ``aclose()`` returns."""
    key = unique_key("agen")

    async def stream() -> Any:
        async with ahold_lease(key, 30):
            yield 1
            yield 2

    async def scenario() -> Any:
        chunks = stream()
        assert await chunks.__anext__() == 1
        await chunks.aclose()
        return await asyncio.to_thread(closing_connections(Lease.objects.current), key)

    assert async_to_sync(scenario)() is None


def test_a_hold_closed_from_another_running_loop_is_given_back() -> None:
    """``coroutine.close()`` called from a coroutine of another loop on the same thread (a
    later ``asyncio.run``): the closing body must not await — Python would raise "coroutine
    ignored GeneratorExit" at the caller — and gives its lease back."""
    key = unique_key("closed-in-loop")
    entered = threading.Event()
    raised: list[RuntimeError] = []

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        coroutine = hold_for_ever(key, entered)
        task = loop.create_task(coroutine)
        loop.run_until_complete(asyncio.to_thread(entered.wait, 30))
        loop.close()
        del task

        async def later() -> None:
            try:
                coroutine.close()
            except RuntimeError as exc:
                raised.append(exc)

        asyncio.run(later())

    on_another_thread(closing_connections(scenario))
    given_back(key)
    assert not raised, f"close() raised {raised[0]!r}"


def test_a_hold_collected_while_another_loop_runs_is_given_back() -> None:
    """The task of a loop closed earlier, collected by a ``gc`` pass that runs while the
    thread's next loop runs: given back (before, its release was scheduled on that other
    loop and cancelled when it ended, and the lease renewed on)."""
    key = unique_key("collected-elsewhere")
    entered = threading.Event()

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(hold_for_ever(key, entered))
        loop.run_until_complete(asyncio.to_thread(entered.wait, 30))
        loop.close()
        del task

        async def next_loop() -> None:
            gc.collect()

        asyncio.run(next_loop())

    on_another_thread(closing_connections(scenario))
    given_back(key)


def test_a_forgotten_task_collected_on_its_running_loop_is_given_back() -> None:
    """A task nobody kept, collected on its own loop while that loop runs on."""
    key = unique_key("collected")
    entered = threading.Event()

    def scenario() -> None:
        async def main() -> None:
            asyncio.get_running_loop().create_task(hold_for_ever(key, entered))
            await asyncio.to_thread(entered.wait, 30)
            gc.collect()

        asyncio.run(main())

    on_another_thread(closing_connections(scenario))
    given_back(key)


def test_a_cancellation_from_outside_arriving_with_the_loss_still_cancels_the_task() -> None:
    """``ahold_lease`` turns only its own cancellation into ``LeaseLostError``, as
    ``asyncio.timeout`` turns only its own into ``TimeoutError``: a task also cancelled from
    outside (a shutdown, a ``TaskGroup`` sibling failing) while the loss is being told still
    ends cancelled, and the cancellation is not lost to a caller that handles the loss."""
    key = unique_key("hold")
    told = threading.Event()
    raised: list[type[BaseException]] = []
    carried_on: list[bool] = []

    def on_lost(sender: Any, key: str = "", **kwargs: Any) -> None:
        if key == wanted:
            told.set()  # sent after the hold's own cancel() was handed to the loop

    wanted = key
    lease_lost.connect(on_lost, weak=False)

    async def scenario() -> None:
        ready = asyncio.Event()

        async def hold() -> None:
            try:
                async with ahold_lease(key, 3.0) as held:
                    await take_over(held, key)
                    assert told.wait(30), "the loss was never seen"  # blocks the loop: on purpose
                    ready.set()  # the outside cancel() below runs before this task resumes
                    await asyncio.sleep(60)
            except BaseException as exc:
                raised.append(type(exc))
                if not isinstance(exc, LeaseLostError):
                    raise
            # A holder that handles the loss carries on, e.g. to hold the key again later.
            await asyncio.sleep(0)
            carried_on.append(True)

        task = asyncio.ensure_future(hold())
        await ready.wait()
        task.cancel("shutting down")
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        async_to_sync(scenario)()
    finally:
        lease_lost.disconnect(on_lost)
    assert carried_on == [], f"the task went on though cancelled (the hold raised {raised})"
    assert raised == [asyncio.CancelledError]


def test_the_loss_alone_still_raises_lease_lost() -> None:
    """The same loss with no cancellation from outside is told as ``LeaseLostError``, and
    the task, having handled it, goes on uncancelled."""
    key = unique_key("hold")

    async def scenario() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        try:
            async with ahold_lease(key, 3.0) as held:
                await take_over(held, key)
                await asyncio.sleep(60)  # cancelled by the hold once it sees the loss
        except LeaseLostError as exc:
            raised.append(type(exc))
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)
        return raised

    assert async_to_sync(scenario)() == [LeaseLostError]
