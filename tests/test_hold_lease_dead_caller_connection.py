"""The final check of a hold whose caller connection died during the body.

The lease is held throughout (renewed on the renewer's own connection); only the caller's
connection, idle while the body worked, was closed by the server (an idle timeout of the
server, a pooler or a firewall, or a kill). The final check used to fail at once on it and
raise ``LeaseLostError`` (and send ``lease_lost``) for a lease that was never lost, so a
caller redid work that counted. It is now tried once more on a fresh connection, as the
release is, and the hold ends normally, its lease given back.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_leases import hold_lease
from django_leases.models import Lease
from django_leases.signals import lease_lost
from tests.helpers import backend_pid, on_another_thread, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def _kill(pid: int) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"KILL CONNECTION {int(pid)}")
        else:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_hold_whose_caller_connection_was_killed_ends_normally(sql_path: str) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("no server to end the connection")
    lost: list[str] = []

    def receiver(sender: object, key: str, **kwargs: object) -> None:
        lost.append(key)

    lease_lost.connect(receiver)
    key = unique_key("dead-caller")
    try:
        with hold_lease(key, ttl=30) as held:
            pid = backend_pid()  # the caller's connection, idle through the rest of the body
            on_another_thread(lambda: _kill(pid))
        assert held.released is True
        assert not held.lost.is_set() and lost == []
        assert Lease.objects.current(key) is None, "the lease was not given back"
    finally:
        lease_lost.disconnect(receiver)
        connection.close()
