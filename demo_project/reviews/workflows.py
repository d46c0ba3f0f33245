"""The demo's pull-request workflow: checks in parallel, a durable sleep, then an approval.

``review-pull-request`` is started by a GitHub ``pull_request`` delivery with action
``opened`` (its input is the delivery's payload), keyed by the pull request
(``"octo-org/octo-repo#8"``, :func:`~demo_project.reviews.payloads.pull_request_key`): one
run per pull request (see :mod:`demo_project.reviews.triggers`). It:

1. fans out the checks with ``run.parallel``: ``check-lint``, ``check-tests`` and
   ``check-preview`` (step function ``reviews.check``) are scheduled in one pass and run
   concurrently by whichever workers are free; each takes ``DEMO_CHECK_SECONDS`` seconds (a
   setting, or the environment variable of that name; default 1);
2. sleeps ``settle`` with ``run.sleep``: ``DEMO_REVIEW_SETTLE_SECONDS`` seconds (default 5),
   a quiet period before asking for review — where a real team would let late CI statuses
   and a quick force-push land. The end is recorded on the database clock when the run first
   gets there; no worker holds the run meanwhile, and a worker restart changes nothing;
3. waits with ``run.wait_for_event("approved")`` for an approving review: the
   ``pull_request_review`` handler sends that event (with the review delivery's payload) to
   the run of its pull request; a review that is not an approval sends nothing;
4. ``announce`` (``reviews.announce``): the comment it would post, naming the approver and
   the checks (recorded in the step's result, not posted).

Its output names the pull request, the head commit, each check's conclusion and the approver.
Every step function here is idempotent (its result depends only on its input) and journalled
(:mod:`demo_project.journal`: which worker ran which attempt).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from demo_project.journal.steps import journalled
from demo_project.previews.workflows import seconds_setting
from django_leases.workflows import step_function, workflow

WORKFLOW = "review-pull-request"
#: The checks every pull request gets, in the order their results are returned.
CHECKS = ("lint", "tests", "preview")
#: The event an approving review sends to the run.
APPROVED = "approved"
SETTLE = "settle"


def check_seconds() -> float:
    """How long one check takes, seconds (``float``): ``settings.DEMO_CHECK_SECONDS``, else
    the environment variable of that name, else 1. Raises ``ValueError`` for a non-number."""
    return seconds_setting("DEMO_CHECK_SECONDS", "1")


def settle_seconds() -> float:
    """The ``settle`` sleep, seconds (``float``): ``settings.DEMO_REVIEW_SETTLE_SECONDS``, else
    the environment variable of that name, else 5. Raises ``ValueError`` for a non-number."""
    return seconds_setting("DEMO_REVIEW_SETTLE_SECONDS", "5")


def _pull_request(event: Any) -> dict[str, Any]:
    """What the run needs of a ``pull_request`` payload (JSON)."""
    pull = event.get("pull_request") if isinstance(event, dict) else None
    repository = event.get("repository") if isinstance(event, dict) else None
    if not isinstance(pull, dict) or not isinstance(repository, dict):
        raise ValueError("review-pull-request expects a GitHub pull_request payload")
    head = pull.get("head") or {}
    return {
        "repository": repository.get("full_name"),
        "number": pull.get("number"),
        "title": pull.get("title"),
        "author": (pull.get("user") or {}).get("login"),
        "head_ref": head.get("ref"),
        "head_sha": head.get("sha"),
        "url": pull.get("html_url"),
    }


@workflow(WORKFLOW)
def review_pull_request(run: Any, event: dict[str, Any]) -> dict[str, Any]:
    """Checks in parallel → a durable sleep → wait for an approving review → announce."""
    pull = _pull_request(event)
    results = run.parallel(
        [(f"check-{name}", "reviews.check", {**pull, "check": name}) for name in CHECKS],
        retries=2,
        retry_delay=1,
    )
    run.sleep(SETTLE, settle_seconds())
    approval = run.wait_for_event(APPROVED)
    review = (approval.get("review") if isinstance(approval, dict) else None) or {}
    approver = (review.get("user") or {}).get("login")
    checks = {result["check"]: result["conclusion"] for result in results}
    comment = run.step(
        "announce",
        "reviews.announce",
        {"pull_request": pull, "checks": checks, "approved_by": approver},
        retries=3,
    )
    return {
        "repository": pull["repository"],
        "number": pull["number"],
        "head_sha": pull["head_sha"],
        "checks": checks,
        "approved_by": approver,
        "review_id": review.get("id"),
        "comment": comment["body"],
    }


@step_function("reviews.check")
def check(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """One check of the pull request's head commit (a deterministic stand-in: it passes,
    with a digest of what it checked), taking :func:`check_seconds`."""
    with journalled(ctx, WORKFLOW):
        name, sha = data.get("check"), data.get("head_sha")
        if not isinstance(name, str) or not isinstance(sha, str):
            raise ValueError("a check needs a check name and the head commit")
        deadline = time.monotonic() + check_seconds()
        while (left := deadline - time.monotonic()) > 0:
            ctx.check()  # stop early once the step lease is lost: the result would not land
            time.sleep(min(left, 0.1))
        digest = hashlib.sha256(f"{data.get('repository')}\0{sha}\0{name}".encode()).hexdigest()
        return {
            "check": name,
            "conclusion": "success",
            "head_sha": sha,
            "summary": f"{name} passed on {sha[:7]} ({digest[:8]})",
        }


@step_function("reviews.announce")
def announce(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The comment the run would post once the pull request is approved (not posted)."""
    with journalled(ctx, WORKFLOW):
        pull, checks = data["pull_request"], data["checks"]
        passed = ", ".join(f"{name} {conclusion}" for name, conclusion in checks.items())
        body = (
            f"#{pull['number']} ({pull['head_sha'][:7]}) approved by @{data['approved_by']}; "
            f"checks: {passed}."
        )
        return {"body": body, "posted": False}
