"""``Lease.objects.release_held``: the final check and the release, in one statement where
tuned (PostgreSQL), in one transaction on the portable path; the same answers on both."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.models import Lease
from tests.helpers import lapse_lease, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_release_held_releases_a_live_lease_and_vouches_for_it(sql_path: str) -> None:
    key = unique_key("release-held")
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    with CaptureQueriesContext(connection) as captured:
        assert Lease.objects.release_held(lease) is True
    if sql_path == "tuned" and connection.vendor == "postgresql":
        assert len(captured.captured_queries) == 1
    assert Lease.objects.current(key) is None, "the lease is still live after release_held"
    taken = Lease.objects.acquire(key, "b", 60)
    assert taken is not None and taken.token == lease.token + 1
    assert Lease.objects.release_held(lease) is None, "a passed-on lease matched"
    assert Lease.objects.current(key) is not None, "a stale release_held released the new one"


def test_release_held_does_not_vouch_for_a_lapsed_lease_but_releases_it(sql_path: str) -> None:
    key = unique_key("release-held")
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    lapse_lease(key)
    assert Lease.objects.release_held(lease) is False
    assert Lease.objects.filter(key=key, released_at__isnull=False).exists()
    assert Lease.objects.release_held(lease) is None, "released twice"
