"""The public API as a user's type checker sees it.

The package's ``__init__`` modules import their public names lazily (``__getattr__``), and
declare them for type checkers under ``TYPE_CHECKING``; strict mypy only counts those as
exported when ``__all__`` lists them literally. A user's ``mypy --strict`` over
``from django_leases.workflows import workflow`` must pass.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("django_leases", "django_leases.workflows", "django_leases.triggers")


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_exactly_the_lazy_names(name: str) -> None:
    package = importlib.import_module(name)
    lazy = set(package._LAZY)
    assert set(package.__all__) - {"__version__"} == lazy
    assert len(package.__all__) == len(set(package.__all__))
    for attribute in sorted(lazy):
        assert getattr(package, attribute) is not None


def _user_code() -> str:
    lines = ["from __future__ import annotations", ""]
    for name in PACKAGES:
        names = sorted(importlib.import_module(name)._LAZY)
        lines.append(f"from {name} import {', '.join(names)}")
        lines.append(f"print({', '.join(names)})")
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="type checking needs no database: SQLite pass only"
)
def test_strict_mypy_accepts_imports_of_the_public_api(tmp_path: Path) -> None:
    user = tmp_path / "user_code.py"
    user.write_text(_user_code())
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(user),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
