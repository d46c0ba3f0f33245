"""The read-only probe and the read-only refusal, on every backend: what the worker's
start-up check and its log line rest on (``tests/test_worker_connections.py`` runs the worker
against a read-only role on PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection

from django_leases import db
from django_leases.management.base import DATABASE_UNREACHABLE, read_only_database_error
from django_leases.models import Lease
from tests.helpers import unique_key

pytestmark = pytest.mark.django_db(transaction=True)

#: How each backend makes this session read-only, and takes it back.
READ_ONLY = {
    "postgresql": (
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    ),
    "mysql": ("SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"),
    "sqlite": ("PRAGMA query_only = 1", "PRAGMA query_only = 0"),
}


@pytest.fixture
def read_only() -> Iterator[None]:
    on, off = READ_ONLY[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(on)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(off)


def test_a_read_write_database_has_no_read_only_reason() -> None:
    assert db.read_only_reason(connection) is None
    assert read_only_database_error(connection.alias) is None


def test_a_read_only_session_is_found_and_named(read_only: None) -> None:
    reason = db.read_only_reason(connection)
    assert reason is not None and "read-only" in reason
    error = read_only_database_error(connection.alias)
    assert error is not None and error.returncode == DATABASE_UNREACHABLE
    assert "refuses writes" in str(error) and reason in str(error)


def test_a_write_the_database_refuses_as_read_only_is_told_from_other_errors(
    read_only: None,
) -> None:
    with pytest.raises(DatabaseError) as refused:
        Lease.objects.acquire(unique_key("read-only"), "me", 30)
    assert db.refused_as_read_only(refused.value), repr(refused.value)
    assert not db.refused_as_read_only(DatabaseError("deadlock detected"))
