"""The demo's pull-request payloads, and what its handlers read from them.

``samples/`` holds a GitHub ``pull_request`` delivery (action ``opened``) and three
``pull_request_review`` deliveries (action ``submitted``; review states ``commented``,
``changes_requested`` and ``approved``) for pull request #8 of ``octo-org/octo-repo``, written
from GitHub's documented webhook payloads (a review event carries the shorter pull-request
object, without ``merged``, ``comments``… counts). A file's folder is its ``X-GitHub-Event``.

A review run is keyed by the pull request (:func:`pull_request_key`), so each pull request has
one. The tour opens a new pull request each time it runs on the same database: it sends
copies of the samples renumbered for the next free number (:func:`renumbered`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parent / "samples"
#: The pull request the samples are about.
SAMPLE_NUMBER = 8
OPENED = SAMPLES / "pull_request" / "opened.json"
#: The review samples by review state.
REVIEWS = {
    state: SAMPLES / "pull_request_review" / f"submitted-{state.replace('_', '-')}.json"
    for state in ("commented", "changes_requested", "approved")
}


def pull_request_key(payload: dict[str, Any]) -> str | None:
    """``"owner/repo#N"`` for a ``pull_request`` or ``pull_request_review`` payload (both
    carry ``pull_request.number`` and ``repository.full_name``); ``None`` when it has not."""
    pull_request = payload.get("pull_request")
    repository = payload.get("repository")
    number = pull_request.get("number") if isinstance(pull_request, dict) else None
    name = repository.get("full_name") if isinstance(repository, dict) else None
    if not isinstance(name, str) or not isinstance(number, int) or isinstance(number, bool):
        return None
    return f"{name}#{number}"


def _renumber(value: Any, old: int, new: int) -> Any:
    if isinstance(value, dict):
        return {
            key: new if key == "number" and item == old else _renumber(item, old, new)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_renumber(item, old, new) for item in value]
    if isinstance(value, str):
        return re.sub(rf"/(pulls|pull|issues)/{old}(?![0-9])", rf"/\g<1>/{new}", value)
    return value


def renumbered(path: Path, number: int, folder: Path) -> Path:
    """A copy of sample ``path`` about pull request ``number`` (an ``int``) instead of
    :data:`SAMPLE_NUMBER`: its ``number`` fields and its pull-request and issue URLs changed,
    the rest as it is. Written to ``folder/<event>/<file name>`` (the event folder kept);
    returns that path. For ``SAMPLE_NUMBER`` the copy has the sample's bytes."""
    payload = json.loads(path.read_text())
    target = folder / path.parent.name / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    changed = _renumber(payload, SAMPLE_NUMBER, number)
    target.write_text(json.dumps(changed, indent=2, ensure_ascii=False) + "\n")
    return target
