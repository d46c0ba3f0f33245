"""The demo's workflow: a GitHub push builds a preview and records the comment it would post.

``build-preview`` is started with a GitHub ``push`` delivery body as its input (the webhook's
``StartWorkflow("build-preview")`` handler does that; ``manage.py start_workflow build-preview
--input "$(cat payload.json)"`` too). Its steps:

1. ``checkout`` (``previews.checkout``): picks repository, ref and commit from the push;
2. ``build`` (``previews.build``): a deterministic "build" — a digest of the repository, the
   commit and the pushed commit ids — taking ``DEMO_STEP_SECONDS`` seconds (a setting, or the
   environment variable of that name; default 0.2), or ``DEMO_SLOW_BUILD_SECONDS`` (default 5)
   when the head commit's message contains ``[slow build]`` — the tour pushes such a commit to
   catch a worker mid-step. It writes a :class:`~demo_project.previews.models.PreviewBuild`;
3. ``comment`` (``previews.comment``): records the preview URL and the comment it would post
   on the commit as a :class:`~demo_project.previews.models.PreviewComment` (the demo posts
   nothing).

A push that deletes a branch or tag completes after ``checkout`` with nothing to build.

Every step function here is **idempotent**: its result depends only on its input, and its
writes are keyed by the run, so running it twice (a worker can die after the work but before
the result is recorded, and the step then runs again as the next attempt) leaves one build and
one comment. The writes are also **fenced by the attempt number** (``ctx.attempt``): a worker
paused past its step lease, while another worker ran the step again as a later attempt, has
its late write refused — the same rule the workflow store applies to the step's result. A real
``comment`` step would key the posted comment on ``ctx.run_id`` the same way and update it if
it exists. Each execution is journalled (:mod:`demo_project.journal`): which worker ran which
attempt, and whether its write landed.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from django.conf import settings

from demo_project.journal.steps import journalled
from demo_project.previews.models import PreviewBuild, PreviewComment
from django_leases.workflows import step_function, workflow

#: Where the demo pretends previews are served.
PREVIEW_BASE_URL = "https://previews.example.test"
_NO_COMMIT = "0" * 40
#: A head commit whose message contains this builds slowly (``DEMO_SLOW_BUILD_SECONDS``).
SLOW_BUILD_MARKER = "[slow build]"
WORKFLOW = "build-preview"


def seconds_setting(name: str, default: str) -> float:
    """A number of seconds (``float``, at least 0) from ``settings.<name>``, else the
    environment variable ``name``, else ``default`` (text). Raises ``ValueError`` for a value
    that is not a number."""
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None
    return max(0.0, seconds)


def step_seconds(slow: bool = False) -> float:
    """How long the demo's ``build`` step takes, in seconds (``float``): for a normal push,
    ``settings.DEMO_STEP_SECONDS``, else the environment variable of that name, else 0.2; for
    a ``[slow build]`` push, ``DEMO_SLOW_BUILD_SECONDS`` the same way, else 5.

    Raises ``ValueError`` for a value that is not a number."""
    if slow:
        return seconds_setting("DEMO_SLOW_BUILD_SECONDS", "5")
    return seconds_setting("DEMO_STEP_SECONDS", "0.2")


@workflow(WORKFLOW)
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
            "slow": SLOW_BUILD_MARKER in str((push.get("head_commit") or {}).get("message") or ""),
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
    with journalled(ctx, WORKFLOW):
        repository, ref, after = data.get("repository"), data.get("ref"), data.get("after")
        if (
            not isinstance(repository, str)
            or not isinstance(ref, str)
            or not isinstance(after, str)
        ):
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
            "slow": bool(data.get("slow")),
        }


@step_function("previews.build")
def build(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A deterministic stand-in for a build: a digest of what was pushed, recorded as a
    :class:`PreviewBuild` fenced by the attempt."""
    with journalled(ctx, WORKFLOW) as entry:
        digest = hashlib.sha256()
        for part in (data["repository"], data["sha"], *data.get("commits", [])):
            digest.update(str(part).encode())
            digest.update(b"\0")
        build_id = digest.hexdigest()[:12]
        artifact = f"previews/{data['repository']}/{build_id}.tar.gz"
        deadline = time.monotonic() + step_seconds(bool(data.get("slow")))
        while (left := deadline - time.monotonic()) > 0:
            ctx.check()  # stop early once the step lease is lost: the result would not land
            time.sleep(min(left, 0.1))
        # The fence, not the check above, is what keeps a stale attempt out: a worker paused
        # here past its step lease wakes up with its check passed and its work done.
        entry.write(
            PreviewBuild,
            repository=data["repository"],
            ref=data["ref"],
            sha=data["sha"],
            build_id=build_id,
            artifact=artifact,
        )
        return {"build_id": build_id, "artifact": artifact}


@step_function("previews.comment")
def comment(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The comment the preview would be announced with (recorded as a :class:`PreviewComment`,
    not posted)."""
    with journalled(ctx, WORKFLOW) as entry:
        source, built = data["source"], data["build"]
        url = f"{PREVIEW_BASE_URL}/{source['repository']}/{built['build_id']}/"
        body = (
            f"Preview of {source['ref_kind']} `{source['ref_name']}` "
            f"({source['sha'][:7]}) is ready: {url}"
        )
        entry.write(
            PreviewComment,
            repository=source["repository"],
            commit=source["sha"],
            url=url,
            body=body,
        )
        return {"url": url, "commit": source["sha"], "body": body, "posted": False}
