"""A lease call outlives a connection the server ended, whatever the driver says about it.

A connection the server ended (``pg_terminate_backend``, a failover, an idle timeout) on which
a statement already failed is kept by psycopg2, closed, and reported on every later statement
as an ``InterfaceError`` ("connection already closed"), which Django does not count among its
``DatabaseError``s and never replaces by itself. Outside a transaction the lease statements
connect afresh (nothing is lost), and ``hold_lease(key, wait=...)``, which documents that "a
database error while waiting is logged and tried again", counts that error among them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection, transaction

from django_leases import hold_lease
from django_leases.db import DATABASE_FAULTS
from django_leases.models import Lease
from tests.helpers import backend_pid, on_another_thread, unique_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


@pytest.fixture(autouse=True)
def _fresh_connection_after() -> Iterator[None]:
    """Whatever the test left of the killed connection, the flush after it gets a new one."""
    yield
    connection.close()


def _kill_own_backend_and_fail_a_query() -> None:
    """The calling thread's connection is ended by the server, and a statement on it fails
    (as the caller's own query would): the connection object is kept, dead."""
    pid = backend_pid()

    def kill() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                assert cursor.fetchone()[0]
        finally:
            connection.close()

    on_another_thread(kill)
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def test_a_waiting_hold_reconnects_after_the_server_ended_its_connection() -> None:
    """Rule: a database error while ``hold_lease(wait=...)`` waits is logged and tried again
    on a fresh connection — a connection psycopg2 already saw die included."""
    key = unique_key("dead-conn-wait")
    _kill_own_backend_and_fail_a_query()
    with hold_lease(key, ttl=5, wait=30) as held:
        assert Lease.objects.filter(key=key, holder=held.holder).exists()


def test_a_lease_acquire_on_a_dead_connection_connects_afresh() -> None:
    """Rule: outside a transaction, ``hold_lease`` without ``wait`` on a connection the
    server ended takes the lease on a new connection, on either driver."""
    key = unique_key("dead-conn-nowait")
    _kill_own_backend_and_fail_a_query()
    with hold_lease(key, ttl=5) as held:
        assert Lease.objects.filter(key=key, holder=held.holder).exists()


def test_a_waiting_ahold_reconnects_after_the_server_ended_its_connection() -> None:
    """Rule: ``ahold_lease(wait=...)`` (Django's async ORM thread) also logs a database error
    while it waits and tries again on a fresh connection — a connection of that thread which
    psycopg2 already saw die included."""
    from asgiref.sync import async_to_sync, sync_to_async

    from django_leases import ahold_lease

    key = unique_key("dead-conn-await")

    async def body() -> bool:
        # The thread-sensitive executor thread: the one ahold_lease's acquire runs on.
        await sync_to_async(_kill_own_backend_and_fail_a_query)()
        try:
            async with ahold_lease(key, ttl=5, wait=30):
                return await Lease.objects.filter(key=key).aexists()
        finally:
            await sync_to_async(lambda: connection.close())()

    assert async_to_sync(body)()


def test_a_dead_connection_is_not_replaced_inside_a_manual_transaction() -> None:
    """Rule: with autocommit off (the caller's manual transaction), a lease acquire on a
    connection the server ended does not connect afresh in autocommit: it fails, nothing is
    committed behind the caller's back, and the connection is still not in autocommit."""
    key = unique_key("manual-tx-dead")
    transaction.set_autocommit(False)
    try:
        _kill_own_backend_and_fail_a_query()
        with pytest.raises(DATABASE_FAULTS):
            Lease.objects.acquire(key, "manual-holder", 5)
        assert connection.autocommit is False
        with contextlib.suppress(*DATABASE_FAULTS):
            transaction.rollback()
    finally:
        connection.close()
    assert not Lease.objects.filter(key=key).exists(), "the lease was committed"
