"""MariaDB: a database that stops answering at the end of a hold.

The final check and the release at the end of a hold never wait longer than the lease's
local deadline (a second at least) and ``RELEASE_TIMEOUT``: past that the connection is cut
and the hold reports ``LeaseLostError`` (it could not vouch). ``db.bounded`` cut PostgreSQL's
connections only: on MariaDB a body that ended just after the database went silent waited on
the final check's reply for as long as TCP kept the connection. (A *new* connection into a
silent server is bounded by ``OPTIONS["connect_timeout"]``, which the backends page sets.)
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_leases import LeaseLostError, hold_lease
from tests.helpers import end_renewers, unique_key
from tests.test_lease_timeouts import FreezableProxy

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]


def test_a_final_check_in_a_black_hole_cannot_vouch_and_does_not_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    end_renewers(monkeypatch)
    settings = connections.settings["default"]
    proxy = FreezableProxy((settings.get("HOST") or "127.0.0.1", int(settings.get("PORT") or 3306)))
    saved = (settings.get("HOST"), settings.get("PORT"))
    connection.close()
    settings["HOST"], settings["PORT"] = "127.0.0.1", proxy.port
    key = unique_key("mariadb-black-hole")
    outcome: list[object] = []

    def hold() -> None:
        try:
            with hold_lease(key, ttl=3):
                proxy.freeze()
            outcome.append("vouched")
        except BaseException as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    try:
        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        thread.join(60)  # a guard, not a measure: the bound is the TTL and RELEASE_TIMEOUT
        assert not thread.is_alive(), "the end of the hold hung on a silent database"
        assert isinstance(outcome[0], LeaseLostError), outcome
    finally:
        settings["HOST"], settings["PORT"] = saved
        proxy.close()
        connection.close()
