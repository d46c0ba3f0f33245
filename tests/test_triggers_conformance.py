"""The shipped trigger-source store conformance suite (rules T1–T13), on this suite's database."""

from __future__ import annotations

from django.test import TransactionTestCase

from django_leases.testing.triggers import TriggerSourceStoreConformanceTests


class TestTriggerSourceStoreConformance(TriggerSourceStoreConformanceTests, TransactionTestCase):
    """T1–T13 on the default database (SQLite or PostgreSQL, whichever the suite runs on)."""
