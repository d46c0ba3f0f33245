"""PostgreSQL's tuned lease path: acquire, refresh and release as functions frozen in a
migration, called on one kept cursor per connection (``db.hot_fetchone``).

The rules themselves are the conformance suite's (both paths, every backend); these tests pin
what the tuned path adds: the frozen text matches the code, the functions are installed, and
the calls stay correct inside ``atomic()`` (savepoints, rollbacks), across a closed or killed
connection (``CONN_MAX_AGE = 0``, a failover) and a changed ``TIME_ZONE``, while Django's
query logging still sees every statement.
"""

from __future__ import annotations

import importlib
import pkgutil
from datetime import timedelta

import pytest
from django.db import OperationalError, close_old_connections, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_leases.models import Lease
from django_leases.models.lease import LEASE_FUNCTIONS_MIGRATION, lease_functions
from tests.helpers import backend_pid, lapse_lease, on_another_thread, tuned_sql, unique_key


def _latest_lease_functions() -> tuple[str, dict[str, str], tuple[str, ...]]:
    """The latest django_leases migration that defines ``LEASE_FUNCTIONS``, and the previous
    release's functions it keeps (``KEPT``)."""
    import django_leases.migrations as package

    found: tuple[str, dict[str, str], tuple[str, ...]] = ("", {}, ())
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"django_leases.migrations.{info.name}")
        if isinstance(getattr(module, "LEASE_FUNCTIONS", None), dict):
            found = (info.name, module.LEASE_FUNCTIONS, tuple(getattr(module, "KEPT", ())))
    return found


def test_the_latest_lease_functions_migration_holds_the_code_s_functions() -> None:
    """As ``makemigrations --check`` for the lease functions: a changed rule needs a new
    migration (its functions get new names), and LEASE_FUNCTIONS_MIGRATION names it."""
    name, frozen, _kept = _latest_lease_functions()
    assert name == LEASE_FUNCTIONS_MIGRATION
    assert frozen == lease_functions(), "the lease functions changed without a migration"


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_migration_installed_the_functions() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname FROM pg_proc WHERE starts_with(proname, 'dl_lease_') ORDER BY 1"
        )
        installed = [name for (name,) in cursor.fetchall()]
    # The previous release's functions stay for its processes during a rolling deploy (a
    # database migrated through the latest lease functions migration has them; a new one,
    # migrated by the first release's squashed migration, has only this code's).
    _name, _frozen, kept = _latest_lease_functions()
    assert set(lease_functions()) <= set(installed) <= {*lease_functions(), *kept}, installed


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_each_operation_is_one_statement_returning_only_what_it_needs() -> None:
    key = unique_key("fn")
    with CaptureQueriesContext(connection) as captured:
        lease = Lease.objects.acquire(key, "a", 30)
        assert lease is not None
        refreshed = Lease.objects.refresh(lease, 45)
        assert refreshed is not None
        assert Lease.objects.release(refreshed) is True
    statements = [query["sql"] for query in captured.captured_queries]
    assert len(statements) == 3, statements
    assert [s.split("(")[0].split()[-1][: len("dl_lease_acquire")] for s in statements] == [
        "dl_lease_acquire",
        "dl_lease_refresh",
        "dl_lease_release",
    ]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_returned_lease_is_the_row() -> None:
    key = unique_key("fn-row")
    lease = Lease.objects.acquire(key, "a", 30)
    assert lease is not None
    row = Lease.objects.get(key=key)
    fields = ("pk", "key", "holder", "token", "expires_at", "acquired_at", "renewed_at")
    assert [getattr(lease, f) for f in fields] == [getattr(row, f) for f in fields]
    assert lease.released_at is None and lease._state.adding is False
    assert lease._state.db == "default"
    refreshed = Lease.objects.refresh(lease, timedelta(seconds=12.3456789))
    assert refreshed is not None
    row = Lease.objects.get(key=key)
    assert [getattr(refreshed, f) for f in fields] == [getattr(row, f) for f in fields]
    assert refreshed.expires_at - refreshed.renewed_at == timedelta(microseconds=12345679)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_inside_atomic_a_rollback_undoes_the_grant_and_a_savepoint_keeps_the_rest() -> None:
    key, other = unique_key("fn-atomic"), unique_key("fn-atomic")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert Lease.objects.acquire(key, "a", 30) is not None
        raise RuntimeError("roll back")
    assert not Lease.objects.filter(key=key).exists()
    with transaction.atomic():
        outer = Lease.objects.acquire(other, "a", 30)
        assert outer is not None
        with pytest.raises(RuntimeError), transaction.atomic():
            assert Lease.objects.refresh(outer, 60) is not None
            assert Lease.objects.release(outer) is True
            raise RuntimeError("roll back the savepoint")
        # The savepoint's release is undone: the outer grant is still live and refreshable.
        assert Lease.objects.refresh(outer, 30) is not None
    assert Lease.objects.current(other) is not None
    # A broken atomic block is refused before anything is sent, as Django's cursor does.
    with transaction.atomic():
        connection.needs_rollback = True
        with pytest.raises(transaction.TransactionManagementError):
            Lease.objects.acquire(unique_key("fn-broken"), "a", 30)
        connection.needs_rollback = False


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_closed_or_killed_connection_is_replaced() -> None:
    key = unique_key("fn-conn")
    lease = Lease.objects.acquire(key, "a", 30)
    assert lease is not None
    connection.close()  # CONN_MAX_AGE = 0: a new connection per request
    lease = Lease.objects.refresh(lease, 30)
    assert lease is not None
    killed = backend_pid()
    on_another_thread(lambda: _terminate(killed))
    # The next statement fails as Django's own would (its exception, the connection marked
    # unusable); Django's request cycle then closes it and the next call reconnects.
    with pytest.raises(OperationalError):
        Lease.objects.refresh(lease, 30)
    close_old_connections()
    assert Lease.objects.release(lease) is True
    assert backend_pid() != killed


def _terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_times_are_read_in_the_connection_s_time_zone() -> None:
    key = unique_key("fn-tz")
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        connection.close()
        lease = Lease.objects.acquire(key, "a", 30)
        assert lease is not None and lease.expires_at.tzinfo is None
        row = Lease.objects.get(key=key)
        assert (lease.expires_at, lease.acquired_at) == (row.expires_at, row.acquired_at)
    connection.close()
    lease = Lease.objects.refresh(lease, 30)
    assert lease is not None and lease.expires_at.tzinfo is not None


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_switch_still_takes_the_portable_path() -> None:
    key = unique_key("fn-switch")
    with tuned_sql(False), CaptureQueriesContext(connection) as captured:
        lease = Lease.objects.acquire(key, "a", 30)
        assert lease is not None
        lapse_lease(key)
        assert Lease.objects.refresh(lease, 30) is None
    assert not any("dl_lease_" in query["sql"] for query in captured.captured_queries)


@pytest.mark.psycopg3_only  # libpq's state of a dead connection is set through psycopg 3
@pytest.mark.django_db(transaction=True)
def test_a_connection_the_driver_knows_dead_is_replaced_outside_a_transaction() -> None:
    """A connection psycopg already knows is broken is replaced by the lease statements
    outside a transaction (nothing of the caller's is lost); inside one, it fails when the
    cursor is made, with Django's exception (callers such as the hold's release retry on
    it)."""
    key = unique_key("fn-dead")
    connection.close()
    lease = Lease.objects.acquire(key, "a", 30)  # a fresh connection, and its kept cursor
    assert lease is not None
    connection.connection.pgconn.finish()  # as libpq leaves a connection it saw die
    connection._dl_hot_cursor = None  # type: ignore[attr-defined]  # a cursor must be made
    assert Lease.objects.release(lease) is True
    lease = Lease.objects.acquire(key, "a", 30)
    assert lease is not None
    with pytest.raises(OperationalError), transaction.atomic():
        connection.connection.pgconn.finish()
        connection._dl_hot_cursor = None  # type: ignore[attr-defined]
        Lease.objects.refresh(lease, 30)
    close_old_connections()
    assert Lease.objects.release(lease) is True
