"""The shipped conformance suite for per-key queue limits and fair claims
(``django_leases.testing.fairness``: Q1–Q9), run on this suite's database — on PostgreSQL
twice: on the tuned statements, and on the portable ORM path (``TUNED_SQL = False``)."""

from __future__ import annotations

from django.test import TransactionTestCase

from django_leases.testing.fairness import QueueFairnessConformanceTests
from tests.helpers import tuned_sql


class TestQueueFairnessConformance(QueueFairnessConformanceTests, TransactionTestCase):
    """The rules with the tuned statements on (PostgreSQL)."""


class TestQueueFairnessConformancePortable(QueueFairnessConformanceTests, TransactionTestCase):
    """The rules on the portable ORM path."""

    def setUp(self) -> None:
        super().setUp()
        self.enterContext(tuned_sql(False))
