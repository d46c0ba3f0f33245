"""The shipped workflow fencing conformance suite (claim rules C1–C12, fencing rules F1–F12),
run on this suite's database (SQLite and PostgreSQL).

It runs twice, as the lease suite does: on the tuned statements PostgreSQL gets (the PL/pgSQL
functions and single statements of ``django_leases.workflows.sql``), and again with them
switched off (``DJANGO_LEASES["TUNED_SQL"] = False``), so the portable ORM path other vendors
take is proven on PostgreSQL too. In that second run every test also checks that no tuned
statement was sent, on any thread or connection: else it proved nothing about the portable
path. (SQLite has no tuned workflow statements: there both runs take the portable path.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.test import TransactionTestCase

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.testing import WorkflowFencingConformanceTests
from django_leases.workflows.sql import FUNCTION_PREFIX
from tests.helpers import tuned_sql


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """Every SQL statement sent while the block runs, on any thread or connection."""
    sent: list[str] = []
    execute, executemany = CursorWrapper._execute, CursorWrapper._executemany

    def recording_execute(self: CursorWrapper, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return execute(self, sql, *args)

    def recording_executemany(self: CursorWrapper, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return executemany(self, sql, *args)

    with (
        mock.patch.object(CursorWrapper, "_execute", recording_execute),
        mock.patch.object(CursorWrapper, "_executemany", recording_executemany),
    ):
        yield sent


def tuned_statements(statements: list[str]) -> list[str]:
    """Those of ``statements`` only the tuned path sends: calls of the workflow functions
    (``SELECT * FROM dl_…(…)``) and the single-statement rules (``WITH …``: common table
    expressions, which the ORM never writes)."""
    call = f"SELECT * FROM {FUNCTION_PREFIX}"
    return [
        statement
        for statement in statements
        if statement.lstrip().startswith(call) or statement.lstrip().upper().startswith("WITH")
    ]


def _run_a_step() -> None:
    """Start a run, schedule, claim and finish a step, then pick the run's next pass with its
    lease: rules that have tuned statements on PostgreSQL."""
    run = WorkflowRun.objects.start("conformance.paths", {})
    WorkflowStep.objects.schedule(run.id, "charge", "charge:card", {})
    claim = WorkflowStep.objects.claim_for_execution(run.id, "charge", "charge:card", 60)
    assert claim is not None
    WorkflowStep.objects.set_result(claim.step_id, "done", claim.attempt)
    assert WorkflowRun.objects.claim_due_pass(60, lease_holder="conformance") is not None


class TestWorkflowFencingConformance(WorkflowFencingConformanceTests, TransactionTestCase):
    """C1–C12 and F1–F12 on the tuned statements (PostgreSQL)."""

    def test_the_tuned_path_is_the_one_running(self) -> None:
        """On PostgreSQL the rules above take the tuned statements, and
        :func:`tuned_statements` sees them (else the portable run's check proves nothing)."""
        if connection.vendor != "postgresql":
            self.skipTest("only PostgreSQL has tuned workflow statements")
        with statements_sent() as sent:
            _run_a_step()
        self.assertTrue(tuned_statements(sent), sent)


class TestWorkflowFencingConformancePortable(WorkflowFencingConformanceTests, TransactionTestCase):
    """C1–C12 and F1–F12 on the portable ORM path (``TUNED_SQL = False``); each test also
    checks that it sent no tuned statement."""

    def setUp(self) -> None:
        super().setUp()
        self.enterContext(tuned_sql(False))
        sent = self.enterContext(statements_sent())
        self.addCleanup(self._assert_portable, sent)

    def _assert_portable(self, sent: list[str]) -> None:
        self.assertEqual(tuned_statements(sent), [], "a tuned statement ran on the portable path")

    def test_the_portable_path_is_the_one_running(self) -> None:
        """The rules that have tuned statements run, and none of those is sent."""
        with statements_sent() as sent:
            _run_a_step()
        self.assertTrue(sent)
        self.assertEqual(tuned_statements(sent), [])
