"""The hot paths stay one SQL statement each on PostgreSQL and SQLite (DESIGN §3); on MariaDB
the refresh is two (a guarded UPDATE, then the row read back: no RETURNING on UPDATE there)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.models import Lease
from tests.helpers import unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def _statements(fn: object) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        fn()  # type: ignore[operator]
    return [query["sql"] for query in captured.captured_queries]


def test_acquire_refresh_release_are_one_statement_each() -> None:
    key = unique_key("hot")
    box: dict[str, Lease | None] = {}
    assert len(_statements(lambda: box.update(lease=Lease.objects.acquire(key, "a", 60)))) == 1
    lease = box["lease"]
    assert lease is not None
    # Refused acquire, refresh, re-acquire by the holder, release, takeover: one each.
    assert len(_statements(lambda: Lease.objects.acquire(key, "b", 60))) == 1
    refresh = 2 if connection.vendor == "mysql" else 1
    assert len(_statements(lambda: box.update(lease=Lease.objects.refresh(lease, 60)))) == refresh
    assert box["lease"] is not None
    assert len(_statements(lambda: Lease.objects.acquire(key, "a", 60))) == 1
    assert len(_statements(lambda: Lease.objects.release(lease))) == 1
    assert len(_statements(lambda: Lease.objects.acquire(key, "b", 60))) == 1
