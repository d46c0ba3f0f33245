"""The docs site as built (``mkdocs build --strict``): the API reference is generated from the
docstrings, and the settings table never breaks a name across lines.

The site is built once for the module into a temporary folder, from this checkout, with the
docs tools (``pip install -e '.[docs]'``, as ``make docs`` does). Missing: the tests are
skipped on a developer's machine and fail under CI (``CI=true``), as the browser tests are.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import ROOT

#: Window widths the settings page is read at: a phone, a tablet, laptops, a wide screen.
WIDTHS = (390, 768, 1024, 1280, 1600)

#: ``<code>`` names in a table's first column that the browser broke over several lines.
BROKEN_NAMES = """() => [...document.querySelectorAll('article table td:first-child code')]
    .filter((code) => code.getClientRects().length > 1)
    .map((code) => code.textContent)"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built strictly (warnings are errors), as a folder."""
    if importlib.util.find_spec("mkdocs") is None:
        message = "mkdocs is missing: pip install -e '.[docs]' (make docs does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (required under CI)")
        pytest.skip(message)
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return built


def test_the_api_reference_is_generated_from_the_docstrings(site: Path) -> None:
    from django_leases.workflows.driver import RunContext
    from django_leases.workflows.engine import StepContext

    page = (site / "reference" / "api" / "workflows" / "index.html").read_text(encoding="utf-8")
    for documented in (RunContext, StepContext, RunContext.step, RunContext.sleep):
        assert f'id="django_leases.workflows.{documented.__qualname__}"' in page
    first_line = (RunContext.__doc__ or "").strip().splitlines()[0]
    assert first_line.replace("``", "") in page.replace("<code>", "").replace("</code>", "")
    for name in ("leases", "tasks", "testing", "exceptions", "signals"):
        assert (site / "reference" / "api" / name / "index.html").is_file(), name


def test_the_settings_table_breaks_no_name(site: Path, browser: Any) -> None:
    page_url = (site / "reference" / "settings" / "index.html").as_uri()
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900})
        try:
            page = context.new_page()
            page.goto(page_url)
            names = page.locator("article table td:first-child code")
            assert names.count() > 20, "the settings table is not there"
            assert page.evaluate(BROKEN_NAMES) == [], width
        finally:
            context.close()
