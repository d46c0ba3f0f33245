"""A recorded error as the run page shows it: its JSON, then its traceback, readable.

A step's (or a run's) error is JSON; an exception's carries its ``traceback``
(:func:`django_leases.validation.error_json`). Shown inside the JSON, the traceback is one
long string of ``\\n`` escapes, cut after a few hundred characters — "KeyError 'review'" and
nothing of where. :func:`error_html` shows the JSON without it, and the traceback below in a
``<details>`` element (opened by a click, no JavaScript) as preformatted text, whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.utils.html import format_html
from django.utils.translation import gettext


def tracebacks(error: Any) -> list[str]:
    """The tracebacks recorded in ``error``: its own, and, for a run failed by a step, the
    step's (``step_error``); empty when there is none."""
    found: list[str] = []
    for value in (error, error.get("step_error") if isinstance(error, Mapping) else None):
        if isinstance(value, Mapping) and isinstance(value.get("traceback"), str):
            found.append(value["traceback"])
    return found


def _without_tracebacks(error: Any) -> Any:
    if not isinstance(error, Mapping):
        return error
    shown = {key: value for key, value in error.items() if key != "traceback"}
    if isinstance(shown.get("step_error"), Mapping):
        shown["step_error"] = _without_tracebacks(shown["step_error"])
    return shown


def error_html(error: Any, json_html: Callable[[Any], str], *, element_id: str = "") -> str:
    """``error`` as safe HTML: ``json_html`` of it without its tracebacks, then each
    traceback in a ``<details class="dl-traceback">`` (``id`` ``element_id`` on the first,
    when given). ``"—"`` (through ``json_html``) for ``None``."""
    shown = json_html(_without_tracebacks(error))
    for number, text in enumerate(tracebacks(error)):
        shown = format_html(
            '{}<details class="dl-traceback"{}><summary>{}</summary><pre>{}</pre></details>',
            shown,
            format_html(' id="{}"', element_id) if element_id and not number else "",
            gettext("traceback"),
            text,
        )
    return shown
