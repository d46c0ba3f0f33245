"""Browser tests: Playwright driving Debian's Chromium against pytest-django's ``live_server``.

* The browser is the system's ``/usr/bin/chromium`` (``apt-get install chromium``), launched
  headless through ``executable_path``; Playwright never downloads a browser of its own.
  ``DL_CHROMIUM`` points elsewhere. Missing: the tests are skipped on a developer's machine
  and **fail** under CI (``CI=true``), so CI cannot go green without them.
* Screenshots go to ``test-artifacts/screenshots/`` (gitignored): ``screenshot("name")`` in a
  test saves ``<test name>-<name>.png``; a failing test gets ``<test name>-failed.png``.
  ``docs_image(path, "name.png")`` marks a screenshot as the one the docs show: with
  ``DL_DOCS_IMAGES=1`` (``make docs-images``) it is copied to ``docs/img/``.
* Playwright's sync API keeps an event loop running in the test thread, so Django would
  refuse ORM calls there as "async-unsafe"; ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set only while a
  browser module runs (module-scoped), never for the rest of the suite.
* The live server answers from another thread, so these tests use real commits
  (``live_server`` implies ``transactional_db``); on SQLite the test database is a file both
  threads share.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "screenshots"
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM = os.environ.get("DL_CHROMIUM", "/usr/bin/chromium")

#: Generous: a loaded 2-core machine can be slow to render the admin.
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's), shared by the tests of one module."""
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: apt-get install -y chromium"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (required under CI)")
        pytest.skip(message)
    sync_api = pytest.importorskip("playwright.sync_api")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_api.sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                # Root (CI, containers) cannot use Chromium's sandbox; /dev/shm may be tiny.
                args=["--no-sandbox", "--disable-dev-shm-usage"],
            )
            try:
                yield chromium
            finally:
                chromium.close()


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


@pytest.fixture
def page(browser: Any, live_server: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser page (own cookies) whose relative URLs go to the live server."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1440, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        yield page
    finally:
        if request.node.stash.get(_FAILED, False):
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=ARTIFACTS / f"{_slug(request.node.name)}-failed.png")
        context.close()


@pytest.fixture
def screenshot(page: Any, request: pytest.FixtureRequest) -> Callable[[str], Path]:
    """``screenshot("name")`` saves the page to ``test-artifacts/screenshots/`` and returns
    the path."""

    def shoot(name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{_slug(request.node.name)}-{_slug(name)}.png"
        page.screenshot(path=path, full_page=True)
        return path

    return shoot


@pytest.fixture
def admin_login(page: Any) -> Callable[[str, str], None]:
    """``admin_login(username, password)`` signs in through the admin's login form."""

    def login(username: str, password: str) -> None:
        page.goto("/admin/login/?next=/admin/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/")

    return login


@pytest.fixture
def docs_image() -> Callable[[Path, str], None]:
    """``docs_image(screenshot_path, "name.png")``: with ``DL_DOCS_IMAGES=1``, copy the
    screenshot to ``docs/img/name.png`` (the docs' images come from the browser tests)."""

    def keep(path: Path, name: str) -> None:
        assert path.is_file(), path
        if os.environ.get("DL_DOCS_IMAGES") == "1":
            shutil.copyfile(path, DOCS_IMG / name)

    return keep


#: Elements of the page's content wider than the window, or scrolling sideways inside.
OVERFLOW_JS = """() => {
  const root = document.documentElement;
  const width = root.clientWidth;
  const found = [];
  if (root.scrollWidth > width) found.push('page ' + root.scrollWidth);
  for (const el of document.querySelectorAll('#content *')) {
    const box = el.getBoundingClientRect();
    const name = el.tagName + '.' + el.className;
    if (box.width === 0 || el.closest('.visually-hidden')) continue;  // screen readers only
    if (box.right > width + 1) found.push(name + ' right=' + box.right);
    else if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible')
      found.push(name + ' scrolls ' + el.scrollWidth + '>' + el.clientWidth);
  }
  return found.slice(0, 10);
}"""


def overflowing(page: Any) -> list[str]:
    """What on ``page``'s content is wider than the window or scrolls sideways (empty: fits)."""
    return list(page.evaluate(OVERFLOW_JS))
