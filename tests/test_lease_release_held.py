"""``Lease.objects.release_held``: the final check and the release in one statement."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.models import Lease

pytestmark = pytest.mark.django_db(transaction=True)

#: Generous bound for waiting on a condition (never a timed assertion).
DEADLINE = 60.0


def _key() -> str:
    return f"release-held:{uuid.uuid4().hex[:12]}"


@pytest.mark.postgres_only
def test_release_held_releases_a_live_lease_in_one_statement_and_vouches_for_it() -> None:
    key = _key()
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    with CaptureQueriesContext(connection) as captured:
        assert Lease.objects.release_held(lease) is True
    assert len(captured.captured_queries) == 1
    assert Lease.objects.current(key) is None, "the lease is still live after release_held"
    taken = Lease.objects.acquire(key, "b", 60)
    assert taken is not None and taken.token == lease.token + 1
    assert Lease.objects.release_held(lease) is None, "a passed-on lease matched"
    assert Lease.objects.current(key) is not None, "a stale release_held released the new one"


@pytest.mark.postgres_only
def test_release_held_does_not_vouch_for_a_lapsed_lease_but_releases_it() -> None:
    key = _key()
    lease = Lease.objects.acquire(key, "a", 0.3)
    assert lease is not None
    give_up = time.monotonic() + DEADLINE
    while Lease.objects.current(key) is not None:  # lapsed on the database clock
        assert time.monotonic() < give_up, "the lease never lapsed"
        time.sleep(0.05)
    assert Lease.objects.release_held(lease) is False
    assert Lease.objects.filter(key=key, released_at__isnull=False).exists()
    assert Lease.objects.release_held(lease) is None, "released twice"


def test_release_held_leaves_other_databases_to_refresh_and_release() -> None:
    key = _key()
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    if connection.vendor == "postgresql":
        assert Lease.objects.release_held(lease) is True
    else:
        assert Lease.objects.release_held(lease) is None
        assert Lease.objects.current(key) is not None, "nothing may be written then"
