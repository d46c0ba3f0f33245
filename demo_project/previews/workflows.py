"""The demo's workflow: a GitHub push builds a preview and records the comment it would post.

``build-preview`` is started with a GitHub ``push`` delivery body as its input (the webhook's
``StartWorkflow("build-preview")`` handler does that; ``manage.py start_workflow build-preview
--input "$(cat payload.json)"`` too). Its steps:

1. ``checkout`` (``previews.checkout``): picks repository, ref and commit from the push;
2. ``build`` (``previews.build``): a deterministic "build" — a digest of the repository, the
   commit and the pushed commit ids — taking ``DEMO_STEP_SECONDS`` seconds (a setting, or the
   environment variable of that name; default 0.2) so a worker can be caught mid-step;
3. ``comment`` (``previews.comment``): records the preview URL and the comment it would post
   on the commit (the demo posts nothing).

A push that deletes a branch or tag completes after ``checkout`` with nothing to build.

Every step function here is **idempotent**: its result depends only on its input, and it has
no side effect outside its return value, so running it twice (a worker can die after the work
but before the result is recorded, and the step then runs again as the next attempt) is
harmless. A real ``comment`` step would make its side effect idempotent too, e.g. by keying
the posted comment on ``(ctx.run_id, ctx.step_name)`` and updating it if it exists.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from django.conf import settings

from django_leases.workflows import step_function, workflow

#: Where the demo pretends previews are served.
PREVIEW_BASE_URL = "https://previews.example.test"
_NO_COMMIT = "0" * 40


def step_seconds() -> float:
    """How long the demo's ``build`` step takes: ``settings.DEMO_STEP_SECONDS``, else the
    ``DEMO_STEP_SECONDS`` environment variable, else 0.2 seconds."""
    value = getattr(settings, "DEMO_STEP_SECONDS", None)
    if value is None:
        value = os.environ.get("DEMO_STEP_SECONDS", "0.2")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"DEMO_STEP_SECONDS must be a number of seconds, not {value!r}") from None
    return max(0.0, seconds)


@workflow("build-preview")
def build_preview(run: Any, push: dict[str, Any]) -> dict[str, Any]:
    """Checkout → build → comment for one GitHub ``push`` delivery body."""
    if not isinstance(push, dict):
        raise ValueError("build-preview expects a GitHub push payload (a JSON object)")
    repository = push.get("repository") or {}
    source = run.step(
        "checkout",
        "previews.checkout",
        {
            "repository": repository.get("full_name"),
            "ref": push.get("ref"),
            "after": push.get("after"),
            "deleted": bool(push.get("deleted")),
            "commits": [c.get("id") for c in push.get("commits") or [] if isinstance(c, dict)],
            "pusher": (push.get("pusher") or {}).get("name"),
        },
    )
    if source["deleted"]:
        return {"repository": source["repository"], "ref": source["ref"], "preview": None}
    build = run.step("build", "previews.build", source, retries=3, retry_delay=1)
    comment = run.step("comment", "previews.comment", {"source": source, "build": build}, retries=3)
    return {
        "repository": source["repository"],
        "ref": source["ref"],
        "sha": source["sha"],
        "build_id": build["build_id"],
        "preview": comment["url"],
    }


@step_function("previews.checkout")
def checkout(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Resolve what to build from the push: repository, ref name and kind, commit."""
    repository, ref, after = data.get("repository"), data.get("ref"), data.get("after")
    if not isinstance(repository, str) or not isinstance(ref, str) or not isinstance(after, str):
        raise ValueError("the push has no repository.full_name, ref or after commit")
    kind, _, name = ref.removeprefix("refs/").partition("/")
    deleted = bool(data.get("deleted")) or after == _NO_COMMIT
    return {
        "repository": repository,
        "ref": ref,
        "ref_kind": {"heads": "branch", "tags": "tag"}.get(kind, kind),
        "ref_name": name or ref,
        "sha": None if deleted else after,
        "deleted": deleted,
        "commits": [c for c in data.get("commits") or [] if isinstance(c, str)],
        "pusher": data.get("pusher"),
    }


@step_function("previews.build")
def build(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A deterministic stand-in for a build: a digest of what was pushed."""
    digest = hashlib.sha256()
    for part in (data["repository"], data["sha"], *data.get("commits", [])):
        digest.update(str(part).encode())
        digest.update(b"\0")
    build_id = digest.hexdigest()[:12]
    deadline = time.monotonic() + step_seconds()
    while (left := deadline - time.monotonic()) > 0:
        ctx.check()  # stop early once the step lease is lost: the result would not land
        time.sleep(min(left, 0.1))
    return {"build_id": build_id, "artifact": f"previews/{data['repository']}/{build_id}.tar.gz"}


@step_function("previews.comment")
def comment(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The comment the preview would be announced with (recorded, not posted)."""
    source, built = data["source"], data["build"]
    url = f"{PREVIEW_BASE_URL}/{source['repository']}/{built['build_id']}/"
    return {
        "url": url,
        "commit": source["sha"],
        "body": f"Preview of {source['ref_kind']} `{source['ref_name']}` "
        f"({source['sha'][:7]}) is ready: {url}",
        "posted": False,
    }
