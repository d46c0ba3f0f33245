"""The async API on every backend (MariaDB too, not PostgreSQL alone): starts from several
event-loop threads, cancelled awaits that leave no lease behind, and a renewal connection
killed under ``hold_lease`` / ``ahold_lease`` that costs nothing (docs/howto/async.md)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from django_leases.models import Lease, WorkflowRun
from django_leases.workflows import astart_workflow, workflow
from tests.helpers import race, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


@workflow("tests.async_backends.idle")
def _idle(run: Any, input: Any) -> Any:
    return None


def test_astart_workflow_from_many_event_loop_threads_uses_working_connections() -> None:
    """astart_workflow from several threads, each with its own loop (as ASGI servers run):
    every start lands, with a queue key, and no connection is left broken."""

    async def starts(prefix: str) -> list[Any]:
        return [
            await astart_workflow("tests.async_backends.idle", {}, queue_key=f"{prefix}-{i}")
            for i in range(5)
        ]

    results = race([lambda p=p: async_to_sync(starts)(p) for p in ("a", "b", "c")])
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert WorkflowRun.objects.filter(pk__in=[r for rs in results for r in rs]).count() == 15


def test_a_cancelled_aacquire_waiting_for_a_held_key_leaves_nothing_behind() -> None:
    """Cancel an awaiting task: the cancelled call's thread finishes what it started, and
    the key can be taken afterwards; the connection of the calling thread still works."""
    key = unique_key("async-cancel")
    lease = Lease.objects.acquire(key, "first", 30)
    assert lease is not None

    async def main() -> Any:
        task = asyncio.ensure_future(Lease.objects.aacquire(key, "second", 30))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return await Lease.objects.acurrent(key)

    current = async_to_sync(main)()
    assert current is not None and current.holder == "first"
    assert Lease.objects.release(lease) is True
    again = Lease.objects.acquire(key, "third", 30)
    assert again is not None and again.holder == "third"


@pytest.mark.parametrize("form", ["hold_lease", "ahold_lease"])
def test_a_killed_renewal_connection_does_not_cost_the_lease(
    form: str, vendor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """test_lease_connections.py proves this on PostgreSQL only: a renewal whose connection
    was killed reconnects, and the lease is kept. MariaDB (KILL CONNECTION) is a backend the
    docs support just the same; ahold_lease's body must not be cancelled for it."""
    if vendor == "sqlite":
        pytest.skip("no server connections to kill")
    from asgiref.sync import sync_to_async

    from django_leases import ahold_lease, hold_lease
    from tests.helpers import terminate_other_backends
    from tests.test_lease_connections import _wait_for_renewals

    key, ttl = unique_key("async-killed"), 1.5
    if form == "hold_lease":
        with hold_lease(key, ttl) as held:
            _wait_for_renewals(key, 1)
            assert terminate_other_backends() >= 1
            _wait_for_renewals(key, 2)
            assert not held.lost.is_set(), "a killed connection cost the lease"
            assert Lease.objects.current(key).token == held.token
    else:

        async def body() -> None:
            async with ahold_lease(key, ttl) as held:
                await sync_to_async(_wait_for_renewals)(key, 1)
                assert await sync_to_async(terminate_other_backends)() >= 1
                await sync_to_async(_wait_for_renewals)(key, 2)
                assert not held.lost.is_set(), "a killed connection cost the lease"
                current = await Lease.objects.acurrent(key)
                assert current is not None and current.token == held.token

        async_to_sync(body)()
    assert any("Renewal of lease" in r.getMessage() for r in caplog.records), (
        "no renewal failed: the kill missed the renewal thread's connection"
    )
    assert Lease.objects.current(key) is None


def test_an_ahold_lease_cancelled_while_waiting_gives_the_key_back() -> None:
    """A task cancelled while ahold_lease waits for a held key: once the holder lets go, the
    abandoned try must not keep the key (its renewal thread would keep it for a dead task)."""
    from django_leases import ahold_lease

    key = unique_key("async-await")
    first = Lease.objects.acquire(key, "first", 30)
    assert first is not None

    async def main() -> None:
        task = asyncio.ensure_future(ahold_lease(key, 5, wait=30).__aenter__())
        for _ in range(3):  # let the task start its first try
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async_to_sync(main)()
    assert Lease.objects.release(first) is True
    again = Lease.objects.acquire(key, "third", 30)
    assert again is not None, "the cancelled ahold_lease took the key and kept it"
