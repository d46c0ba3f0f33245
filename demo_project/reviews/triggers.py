"""The demo's pull-request source: GitHub pull requests start a review run; reviews approve it.

``github-pull-requests`` (provider ``github``, repository ``octo-org/octo-repo``) handles:

* ``pull_request`` — :func:`pull_request_opened`: action ``opened`` starts a
  ``review-pull-request`` run with the payload as its input, keyed by the pull request
  (``StartWorkflow(..., key=...)``: ``"octo-org/octo-repo#8"``), so a pull request has one
  run, and a second delivery for it starts nothing. Other actions (``closed``,
  ``synchronize``…) start nothing; the delivery is recorded with that outcome;
* ``pull_request_review`` — :func:`review_submitted`: a submitted review whose state is
  ``approved`` is sent as event ``approved`` to the run of its pull request
  (``SendEvent("approved", run=review_run)``: the run found by the same key), in the
  transaction that records the delivery; the run then finishes. A review that ``commented``
  or ``changes_requested`` sends nothing: the delivery is recorded, linked to the run, with
  an outcome saying it was not an approval — not an error, the run keeps waiting.

The signing secret is generated when an operator enables the source and given to GitHub
with the hook (the ``github`` provider does both); it lives in the encrypted credential
store. The source receives nothing until it is synced and enabled.
"""

from __future__ import annotations

import uuid

from demo_project.reviews.payloads import pull_request_key
from demo_project.reviews.workflows import APPROVED, WORKFLOW
from django_leases.triggers import (
    Delivery,
    Handled,
    SendEvent,
    StartWorkflow,
    run_for_key,
    webhook_source,
)

SOURCE = "github-pull-requests"


def delivery_key(delivery: Delivery) -> str | None:
    """The review run's key for a delivery about a pull request (``"owner/repo#N"``)."""
    return pull_request_key(delivery.payload)


def review_run(delivery: Delivery) -> uuid.UUID | None:
    """The ``review-pull-request`` run of the pull request a delivery is about (found by its
    key), or ``None`` when that pull request has none."""
    key = delivery_key(delivery)
    return None if key is None else run_for_key(WORKFLOW, key, using=delivery.using)


start_review = StartWorkflow(WORKFLOW, key=delivery_key)
send_approval = SendEvent(APPROVED, run=review_run)


def pull_request_opened(delivery: Delivery) -> uuid.UUID | Handled:
    """``pull_request``: start the review run for action ``opened`` (one per pull request:
    the key makes the start idempotent); any other action starts nothing."""
    key = delivery_key(delivery)
    if key is None:
        return Handled(None, "not a pull request delivery (no pull_request.number): ignored")
    if delivery.action != "opened":
        return Handled(None, f"{key} {delivery.action}: only 'opened' starts a review run")
    return start_review(delivery)


def review_submitted(delivery: Delivery) -> Handled:
    """``pull_request_review``: an approving submitted review is sent to the pull request's
    run as event ``approved``; any other review sends nothing (the outcome says why)."""
    key = delivery_key(delivery)
    review = delivery.payload.get("review")
    review = review if isinstance(review, dict) else {}
    state = str(review.get("state") or "").lower()  # GitHub sends "approved"; be lenient
    reviewer = (review.get("user") or {}).get("login") or "?"
    if key is None:
        return Handled(None, "not a pull request review (no pull_request.number): ignored")
    if delivery.action != "submitted":
        return Handled(None, f"{key}: review {delivery.action}, not submitted: nothing sent")
    if state != APPROVED:
        run_id = review_run(delivery)
        said = f"{key}: review by {reviewer} is {state!r}, not an approval"
        if run_id is None:
            return Handled(None, f"{said} (and the pull request has no review run)")
        return Handled(run_id, f"{said}: no {APPROVED!r} event sent to run {run_id}")
    return send_approval(delivery)


github_pull_requests = webhook_source(
    SOURCE,
    provider="github",
    config={"repository": "octo-org/octo-repo"},
    events={"pull_request": pull_request_opened, "pull_request_review": review_submitted},
)
