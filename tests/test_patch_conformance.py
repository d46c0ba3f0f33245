"""The shipped conformance suite for ``run.patched`` (``django_leases.testing.patches``:
R1–R5), run on this suite's database — on PostgreSQL twice: on the tuned statements, and on
the portable ORM path (``TUNED_SQL = False``), checking that no tuned statement was sent
there."""

from __future__ import annotations

from django.test import TransactionTestCase

from django_leases.testing.patches import WorkflowPatchConformanceTests
from tests.helpers import tuned_sql
from tests.test_workflow_conformance import statements_sent, tuned_statements


class TestWorkflowPatchConformance(WorkflowPatchConformanceTests, TransactionTestCase):
    """The rules on the tuned statements (PostgreSQL)."""


class TestWorkflowPatchConformancePortable(WorkflowPatchConformanceTests, TransactionTestCase):
    """The rules on the portable ORM path; each test also checks it sent no tuned statement."""

    def setUp(self) -> None:
        super().setUp()
        self.enterContext(tuned_sql(False))
        sent = self.enterContext(statements_sent())
        self.addCleanup(self._assert_portable, sent)

    def _assert_portable(self, sent: list[str]) -> None:
        self.assertEqual(tuned_statements(sent), [], "a tuned statement ran on the portable path")
