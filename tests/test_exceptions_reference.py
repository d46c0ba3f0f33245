"""``docs/reference/exceptions.md`` against the code: it names every class of
``django_leases.exceptions``, each is importable where the page says its area's errors are,
and the repair it gives for dropped functions is the one the code gives."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import django_leases
import django_leases.exceptions as exceptions
import django_leases.triggers
import django_leases.workflows

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "exceptions.md"


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(exceptions).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == exceptions.__name__
    }


def test_the_page_names_every_exception() -> None:
    page = PAGE.read_text(encoding="utf-8")
    missing = sorted(name for name in _classes() if not re.search(rf"`{name}\b", page))
    assert missing == []


@pytest.mark.parametrize(
    ("base", "module"),
    [
        (exceptions.LeaseError, django_leases),
        (exceptions.WorkflowError, django_leases.workflows),
        (exceptions.TriggerSourceError, django_leases.triggers),
    ],
    ids=["leases", "workflows", "triggers"],
)
def test_each_area_s_errors_import_from_that_area(base: type, module: object) -> None:
    missing = sorted(
        name
        for name, cls in _classes().items()
        if issubclass(cls, base) and getattr(module, name, None) is not cls
    )
    assert missing == []


def test_the_repair_of_dropped_functions_is_the_one_the_code_gives() -> None:
    page = PAGE.read_text(encoding="utf-8")
    entry = page.split("`WorkflowFunctionsMissing(", 1)[1].split("\n\n", 1)[0]
    assert "leases_check --install-functions" in entry, entry
