"""An ``ahold_lease`` whose coroutine is collected or closed while *some* event loop runs on
the thread is given back too.

Rule (``ahold_lease._closed``): a hold whose coroutine can never run again is given back,
not renewed for as long as the process lives. "No loop running" is not the only way to be
closed outside one's own loop: a task of a loop closed earlier collected (``gc``) while
another loop runs on the same thread (``async_to_sync`` / ``asyncio.run`` called again), or
``coroutine.close()`` called from a coroutine of another loop.
"""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_leases import ahold_lease
from django_leases.models import Lease
from tests.helpers import (
    closing_connections,
    end_renewers,
    held_renewals,
    on_another_thread,
    unique_key,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _renewers_ended(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    yield
    end_renewers(monkeypatch)
    asyncio.run(sync_to_async(connections.close_all)())


async def _hold_for_ever(key: str, entered: threading.Event) -> None:
    async with ahold_lease(key, 3):
        entered.set()
        await asyncio.Event().wait()


def _given_back(key: str) -> None:
    try:
        wait_until(
            lambda: Lease.objects.current(key) is None and not held_renewals(key),
            30,
            what=f"lease {key!r} given back and no longer renewed",
        )
    finally:
        _stop_leaked(key)


def _stop_leaked(key: str) -> None:
    """Stop a leaked renewal of ``key`` (so a failure here leaves the next tests alone)."""
    from django_leases.renewal import renewers

    for renewer in renewers():
        with renewer.cond:
            leaked = [lease for lease in renewer._leases.values() if lease.name == key]
        for lease in leaked:
            renewer.unregister(lease)


def test_a_hold_of_a_closed_loop_closed_from_another_running_loop_is_given_back() -> None:
    key = unique_key("probe-closed-in-loop")
    entered = threading.Event()

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        coroutine = _hold_for_ever(key, entered)
        task = loop.create_task(coroutine)
        loop.run_until_complete(asyncio.to_thread(entered.wait, 30))
        loop.close()
        del task

        async def later() -> None:  # another loop, on the same thread
            try:
                coroutine.close()
            except RuntimeError as exc:  # "coroutine ignored GeneratorExit"
                raised.append(exc)
            await asyncio.sleep(0)

        asyncio.run(later())

    raised: list[RuntimeError] = []
    on_another_thread(closing_connections(scenario))
    _given_back(key)
    assert not raised, f"close() raised {raised[0]!r}"


def test_a_hold_of_a_closed_loop_collected_while_another_loop_runs_is_given_back() -> None:
    """The realistic form: the task of a loop closed earlier is collected by a ``gc`` pass
    that happens to run while the thread's next loop runs (here its first statement); that
    loop then ends. ``_loop_running()`` is true, so ``__aexit__`` awaits on a coroutine being
    closed ("coroutine ignored GeneratorExit") and its release, scheduled on the other loop,
    is cancelled with it: the lease is renewed for as long as the process lives."""
    key = unique_key("probe-collected-elsewhere")
    entered = threading.Event()

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(_hold_for_ever(key, entered))
        loop.run_until_complete(asyncio.to_thread(entered.wait, 30))
        loop.close()
        del task

        async def next_loop() -> None:
            gc.collect()

        asyncio.run(next_loop())

    on_another_thread(closing_connections(scenario))
    _given_back(key)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_forgotten_task_collected_on_its_running_loop_is_given_back() -> None:
    """Passing probe: collected on its own loop, which keeps running, the release scheduled
    there completes (a "coroutine ignored GeneratorExit" is reported as unraisable)."""
    key = unique_key("probe-collected")
    entered = threading.Event()

    def scenario() -> None:
        async def main() -> None:
            asyncio.get_running_loop().create_task(_hold_for_ever(key, entered))
            await asyncio.to_thread(entered.wait, 30)
            gc.collect()
            for _ in range(50):
                await asyncio.sleep(0.01)

        asyncio.run(main())

    on_another_thread(closing_connections(scenario))
    _given_back(key)
