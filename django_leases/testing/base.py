"""The bases of the conformance suites this package ships (leases, fencing, waits…)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DEFAULT_DB_ALIAS

from django_leases.models import WorkflowRun, WorkflowStep

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowRunQuerySet, WorkflowStepQuerySet


class ConformanceSuite:
    """A mixin for Django's ``TransactionTestCase``: the suites' rules are its ``test_*``
    methods. To a type checker it declares the ``TestCase`` methods the rules call; at run
    time the ``TestCase`` the suite is mixed into provides them."""

    if TYPE_CHECKING:  # unittest.TestCase provides these
        assertEqual: Callable[..., None]
        assertIsNone: Callable[..., None]
        assertIsNotNone: Callable[..., None]
        assertIs: Callable[..., None]
        assertIsInstance: Callable[..., None]
        assertNotIsInstance: Callable[..., None]
        assertNotEqual: Callable[..., None]
        assertIn: Callable[..., None]
        assertTrue: Callable[..., None]
        assertFalse: Callable[..., None]
        assertGreater: Callable[..., None]
        assertGreaterEqual: Callable[..., None]
        assertRaises: Callable[..., Any]
        assertRaisesRegex: Callable[..., Any]
        assertLogs: Callable[..., Any]
        fail: Callable[..., Any]
        subTest: Callable[..., Any]
        _testMethodName: str


class WorkflowConformanceSuite(ConformanceSuite):
    """The workflow suites' base: the alias the workflow models live on, and their rows.

    Class attributes you may override:
        workflow_database: the alias the workflow models live on (``str``).
    """

    workflow_database: ClassVar[str] = DEFAULT_DB_ALIAS

    @property
    def runs(self) -> WorkflowRunQuerySet:
        """``WorkflowRun`` rows on :attr:`workflow_database` (a ``WorkflowRunQuerySet``)."""
        return WorkflowRun.objects.db_manager(self.workflow_database).all()

    @property
    def steps(self) -> WorkflowStepQuerySet:
        """``WorkflowStep`` rows on :attr:`workflow_database` (a ``WorkflowStepQuerySet``)."""
        return WorkflowStep.objects.db_manager(self.workflow_database).all()
