"""The shipped trigger-source store conformance suite (rules T1–T13), on this suite's database.

It runs once, unlike the lease and workflow suites: the trigger store has no tuned statements
to switch off (no ``db.tuned()`` branch; PostgreSQL's advisory lock around ``sync`` is not an
alternative to a portable path but how PostgreSQL serialises syncs), which
``test_the_trigger_store_has_no_tuned_path`` keeps true.
"""

from __future__ import annotations

import inspect
import pkgutil
from importlib import import_module

from django.test import TransactionTestCase

import django_leases.triggers
from django_leases.models import trigger
from django_leases.testing.triggers import TriggerSourceStoreConformanceTests


class TestTriggerSourceStoreConformance(TriggerSourceStoreConformanceTests, TransactionTestCase):
    """T1–T13 on the default database (SQLite or PostgreSQL, whichever the suite runs on)."""


def test_the_trigger_store_has_no_tuned_path() -> None:
    """Should the trigger store gain a tuned statement, this suite must also run with
    ``tuned_sql(False)`` (as ``test_workflow_conformance.py`` does): this fails until then."""
    modules = [trigger] + [
        import_module(f"django_leases.triggers.{info.name}")
        for info in pkgutil.iter_modules(django_leases.triggers.__path__)
    ]
    tuned = [module.__name__ for module in modules if "db.tuned(" in inspect.getsource(module)]
    assert tuned == [], f"tuned statements in {tuned}: run the suite on the portable path too"
