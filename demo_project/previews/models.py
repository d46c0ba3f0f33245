"""What the demo's ``build-preview`` workflow writes: a build and a comment per run.

Both are written under the step's attempt number (:class:`~demo_project.journal.models.
AttemptFenced`): a build step that runs again overwrites its own row, and a stale attempt's
late write is refused.
"""

from __future__ import annotations

from django.db import models

from demo_project.journal.models import AttemptFenced


class PreviewBuild(AttemptFenced):
    """The artifact the ``build`` step produced for a run."""

    repository = models.CharField(max_length=300)
    ref = models.CharField(max_length=300)
    sha = models.CharField(max_length=64)
    build_id = models.CharField(max_length=64)
    artifact = models.CharField(max_length=500)

    class Meta:
        ordering = ("-written_at",)

    def __str__(self) -> str:
        return f"{self.repository}@{self.sha[:7]} → {self.build_id}"


class PreviewComment(AttemptFenced):
    """The comment the ``comment`` step would post on the pushed commit (recorded, not posted).

    One per run: a step that runs again updates it instead of posting a second comment.
    """

    repository = models.CharField(max_length=300)
    commit = models.CharField(max_length=64)
    url = models.URLField(max_length=500)
    body = models.TextField()

    class Meta:
        ordering = ("-written_at",)

    def __str__(self) -> str:
        return self.url
