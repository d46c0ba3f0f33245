"""The run page at 1280 px: its steps and attempt tables fit the page (nothing scrolls
sideways), a superseded attempt says so, times share one format, long values wrap instead of
stretching the page. Screenshots: ``docs/img/admin-run-1280.png`` comes from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_leases.clock import db_now_plus
from django_leases.models import WorkflowRun, WorkflowStep
from tests.browser.conftest import overflowing

pytestmark = pytest.mark.timeout(120)

WIDTH = 1280

#: Long values an operator meets: a URL, a commit, a traceback line with no spaces to break at.
LONG_URL = "https://previews.example.test/" + "deployments/" * 12 + "index.html"
LONG_ERROR = {
    "type": "CalledProcessError",
    "message": "Command '['npm', 'run', 'build', '--', '--mode=production']' returned non-zero "
    "exit status 1 while compiling src/components/VeryLongComponentNameForTheDashboard.tsx",
    "traceback": "Traceback (most recent call last):/srv/app/builds/" + "x" * 180,
}


def busy_run() -> WorkflowRun:
    """A failed run: ``checkout`` succeeded on attempt 2 after attempt 1 was superseded (its
    worker lost the step lease), ``build`` failed with a long error, ``publish`` pending."""
    run = WorkflowRun.objects.start("browser-fit.deploy", {"ref": "refs/heads/" + "feature-" * 8})
    WorkflowStep.objects.schedule(run.id, "checkout", "browser-fit.checkout", {"ref": "main"})
    first = WorkflowStep.objects.claim_for_execution(run.id, "checkout", "browser-fit.checkout", 60)
    assert first is not None
    WorkflowStep.objects.filter(pk=first.step_id).update(lease_expires_at=db_now_plus(-1))
    second = WorkflowStep.objects.claim_for_execution(
        run.id, "checkout", "browser-fit.checkout", 60
    )
    assert second is not None and second.attempt == 2
    WorkflowStep.objects.set_result(
        second.step_id, {"sha": "4a7c1e9" * 6, "url": LONG_URL}, second.attempt
    )
    WorkflowStep.objects.schedule(
        run.id, "build", "browser-fit.build", {"sha": "4a7c1e9"}, retries=0
    )
    claim = WorkflowStep.objects.claim_for_execution(run.id, "build", "browser-fit.build", 60)
    assert claim is not None
    WorkflowStep.objects.set_error(claim.step_id, LONG_ERROR, claim.attempt)
    WorkflowStep.objects.schedule(run.id, "publish", "browser-fit.publish", {"url": LONG_URL})
    WorkflowRun.objects.fail(run.id, LONG_ERROR)
    return run


#: Table cells (but JSON values) whose text wraps onto more than one line inside a word.
BROKEN_WORDS = """() => {
  const found = [];
  const cells = document.querySelectorAll(
    '#attempt-history td, #attempt-history th, '
    + '.inline-related.tabular td, .inline-related.tabular th');
  for (const cell of cells) {
    if (cell.querySelector('.dl-json')) continue;
    const text = cell.innerText.trim();
    if (!text || text.includes(' ')) continue;  // one word: it must sit on one line
    const lines = new Set();
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const rect of range.getClientRects())
        if (rect.width > 0) lines.add(Math.round(rect.top));
    }
    if (lines.size > 1) found.push(text);
  }
  return found;
}"""

#: Django's DATETIME_FORMAT for English ("N j, Y, P"): "Dec. 1, 2026, 1:12 p.m.".
LOCALIZED = re.compile(
    r"[A-Z][a-z]{2,3}\.? \d{1,2}, \d{4}, (\d{1,2}(:\d\d)? [ap]\.m\.|noon|midnight)"
)
#: What a time shown raw looks like (str() of a datetime, ISO 8601).
RAW_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d")


def test_the_run_page_fits_1280_pixels(
    page: Any,
    live_server: Any,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
    docs_image: Callable[[Path, str], None],
) -> None:
    run = busy_run()
    User.objects.create_superuser("root", password="pw")
    page.set_viewport_size({"width": WIDTH, "height": 900})
    admin_login("root", "pw")
    page.goto(f"/admin/django_leases/workflowrun/{run.pk}/change/")
    page.wait_for_selector("div.field-history table")
    assert overflowing(page) == []
    assert page.evaluate(BROKEN_WORDS) == []

    history = page.locator("div.field-history table tbody tr")
    rows = [row.split("\t")[:3] for row in history.all_inner_texts()]
    assert rows == [
        ["checkout", "1", "Superseded"],
        ["checkout", "2", "Succeeded"],
        ["build", "1", "Failed"],
    ]
    # One time format on the page: Django's localized one, for its fields and our tables.
    times = page.locator("#content time").all_inner_texts()
    assert len(times) >= 5, times  # the steps' times and the attempts'
    assert all(LOCALIZED.fullmatch(text) for text in times), times
    for cell in page.locator("div.field-created_at div.readonly").all_inner_texts():
        assert LOCALIZED.fullmatch(cell.strip()), cell
    assert not RAW_TIME.search(page.inner_text("#content"))
    # Long values are cut at a word, never inside one.
    error = page.inner_text("div.field-error_json div.readonly")
    assert "VeryLongComponentNameForTheDashboard.tsx" in error
    docs_image(screenshot("run-1280"), "admin-run-1280.png")
