"""A hold whose final check vouched for its lease gives the lease back.

Rule: ``hold_lease`` always releases a lease it still holds when the block ends ("release
unless it lapsed"). The final check of a ``hold_lease`` is a *refresh*: when it answers
"held", the row's expiry is database now + TTL — the lease has certainly not lapsed. If that
answer arrives just after the *local* deadline (a slow final check near the deadline: the
renewal thread is stopped by then, so no watchdog marks it lost), ``finish()`` must still
release it, not leave the key taken for a whole TTL by a holder that has left.
"""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

import pytest

from django_leases import hold_lease
from django_leases.models import Lease
from django_leases.models.lease import LeaseQuerySet
from tests.helpers import end_renewers, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_final_check_answered_after_the_local_deadline_still_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = unique_key("late-final-check")
    real_refresh = LeaseQuerySet.refresh
    holds: list[Any] = []
    finishing: list[bool] = []

    def slow_final_check(queryset: LeaseQuerySet, lease: Lease, ttl: Any) -> Any:
        # The final check's statement is answered once the local deadline has passed (the
        # database is slow): the deadline is "now" when it is sent.
        if finishing and lease.key == key:
            renewal = holds[0]._renewal
            with renewal.renewer.cond:
                renewal._deadline = time.monotonic()
        return real_refresh(queryset, lease, ttl)

    try:
        with (
            mock.patch.object(LeaseQuerySet, "refresh", slow_final_check),
            hold_lease(key, 30) as held,
        ):
            holds.append(held)
            finishing.append(True)
        current = Lease.objects.current(key)
        assert current is None, (
            f"the block ended normally (its final check vouched, refreshing the row to "
            f"expire at {current and current.expires_at}) yet the key is still taken"
        )
    finally:
        end_renewers(monkeypatch)
