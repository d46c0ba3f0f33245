"""The shipped workflow fencing conformance suite (claim rules C1–C12, fencing rules F1–F12),
run on this suite's database (SQLite and PostgreSQL)."""

from __future__ import annotations

from django.test import TransactionTestCase

from django_leases.testing import WorkflowFencingConformanceTests


class TestWorkflowFencingConformance(WorkflowFencingConformanceTests, TransactionTestCase):
    """C1–C12 and F1–F12 on the default database."""
