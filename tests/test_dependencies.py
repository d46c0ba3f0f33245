"""The dependency bounds in ``pyproject.toml`` allow nothing the supported Django refuses."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _requirements() -> dict[str, list[Requirement]]:
    """Requirements by where they are: ``dependencies``, each extra, each dependency group
    (its own lines; an ``include-group`` is checked where it is defined)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    groups = {
        "dependencies": project["dependencies"],
        **project["optional-dependencies"],
        **pyproject.get("dependency-groups", {}),
    }
    return {
        group: [Requirement(line) for line in lines if isinstance(line, str)]
        for group, lines in groups.items()
    }


def _lowest(requirement: Requirement) -> Version | None:
    bounds = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
    return max(bounds, default=None)


def test_every_psycopg_bound_is_one_django_accepts() -> None:
    # Django's PostgreSQL backend states (and enforces at import) its oldest psycopg 3.
    from django.db.backends.postgresql import base

    found = re.search(r"psycopg >= (\d+(?:\.\d+)+)", base.__doc__ or "")
    assert found, "Django's PostgreSQL backend no longer states its psycopg minimum"
    django_minimum = Version(found[1])
    bounds = {
        group: _lowest(requirement)
        for group, requirements in _requirements().items()
        for requirement in requirements
        if requirement.name == "psycopg"
    }
    assert {"postgres", "dev", "bench"} <= set(bounds)
    too_low = {
        group: str(lowest)
        for group, lowest in bounds.items()
        if not lowest or lowest < django_minimum
    }
    assert not too_low, f"psycopg bounds below Django's {django_minimum}: {too_low}"
