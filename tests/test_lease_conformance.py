"""The shipped lease conformance suite (rules L1–L18), run on this suite's database.

It runs twice: on the hand-written single-statement SQL that PostgreSQL and SQLite get, and
again with that path switched off (``DJANGO_LEASES["TUNED_SQL"] = False``) so the portable ORM
path that other vendors use is proven on both backends too.
"""

from __future__ import annotations

from unittest import mock

from django.test import TransactionTestCase

from django_leases.testing import LeaseConformanceTests
from tests.helpers import tuned_sql


class _OnALoadedMachine(LeaseConformanceTests):
    """The suite with 2-second short leases (the suite's default is 1 s): CI runs five
    passes at once on two cores, where a renewal thread can wait its turn for most of a
    second, and L15 then saw a 1-second lease lapse under a live holder."""

    short_ttl = 2.0


class TestLeaseConformance(_OnALoadedMachine, TransactionTestCase):
    """L1–L18 on the single-statement SQL path."""


class TestLeaseConformanceOrmFallback(_OnALoadedMachine, TransactionTestCase):
    """L1–L18 on the portable ORM path (``SELECT … FOR UPDATE`` then ``UPDATE``)."""

    def setUp(self) -> None:
        super().setUp()
        self.enterContext(tuned_sql(False))

    def test_fallback_path_is_the_one_running(self) -> None:
        """The patch really routes acquire through ``_acquire_orm`` (else this run proves
        nothing about the fallback)."""
        from django_leases.models import Lease, LeaseQuerySet

        with mock.patch.object(
            LeaseQuerySet, "_acquire_orm", autospec=True, wraps=LeaseQuerySet._acquire_orm
        ) as orm:
            Lease.objects.acquire(self.new_key(), "a", 60)
        self.assertEqual(orm.call_count, 1)
