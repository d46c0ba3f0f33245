"""How the django-leases admin pages show values: one time format, badges, choice labels,
whole-word cuts.

Times: every time on these pages is shown as Django's admin shows a date and time — in the
current time zone (``TIME_ZONE``, or the one a middleware activated) and the active
language's ``DATETIME_FORMAT`` (``formats.localize``) — so the tables this app renders and the
fields Django renders read the same. The element is a ``<time>`` whose ``datetime`` attribute
holds the ISO 8601 value and whose tooltip (``title``) the exact time, to the millisecond
(the localized formats of most languages stop at the minute).

Stylesheet: :data:`MEDIA_CSS` (``django_leases/admin.css``), which lets the run page's tables
fit the page at 1280 px.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db import models
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.translation import ngettext

#: The stylesheet every django-leases admin page includes (``ModelAdmin.Media.css``).
MEDIA_CSS = {"all": ("django_leases/admin.css",)}


def local_time(value: datetime | None) -> str:
    """``value`` (a ``datetime``, aware or naive, or ``None``) as safe HTML: a ``<time>`` in
    the current time zone and the localized ``DATETIME_FORMAT``; ``"—"`` for ``None``."""
    if value is None:
        return "—"
    shown = timezone.localtime(value) if timezone.is_aware(value) else value
    return format_html(
        '<time class="dl-time" datetime="{}" title="{}">{}</time>',
        shown.isoformat(),
        shown.isoformat(sep=" ", timespec="milliseconds"),
        formats.localize(shown),
    )


def field_column(
    field: str,
    description: Any,
    show: Callable[[Any], str],
    *,
    ordering: str | None = None,
) -> Callable[[Any, Any], str]:
    """A list or page column showing the model's ``field`` through ``show``, to assign in a
    ``ModelAdmin``'s body (what the value means goes in a ``#:`` comment above it).

    Args:
        field: the model field.
        description: the column's heading (translated).
        show: the field's value → safe HTML (:func:`local_time` for a ``datetime``).
        ordering: the field the column sorts by; ``None``: not sortable.

    Returns:
        The display method (``admin.display``'s attributes set).
    """

    def column(model_admin: Any, obj: Any) -> str:
        return show(getattr(obj, field))

    column.__doc__ = f"``{field}`` shown by ``{show.__name__}`` (HTML ``str``)."
    return admin.display(description=description, ordering=ordering)(column)


def time_column(
    field: str, description: Any, *, ordering: str | None = None
) -> Callable[[Any, Any], str]:
    """:func:`field_column` for a ``datetime`` field: :func:`local_time` text (``"—"`` for
    ``None``). Arguments and return as there."""
    return field_column(field, description, local_time, ordering=ordering)


#: Items of one kind a page or message lists one by one (child runs, forks, lease keys); the
#: rest are counted (:func:`and_more`).
LINKS_SHOWN = 20


def and_more(count: int) -> str:
    """``"… and N more"`` in the active language: what follows a list cut after its first
    items (``count``: how many it leaves out)."""
    return ngettext("… and %(count)d more", "… and %(count)d more", count) % {"count": count}


def listed(items: Sequence[str], shown: int = LINKS_SHOWN) -> str:
    """The first ``shown`` of ``items`` joined with commas, then :func:`and_more` for the rest
    (a message about thousands of rows stays short)."""
    text = ", ".join(items[:shown])
    return text if len(items) <= shown else f"{text} {and_more(len(items) - shown)}"


#: Characters of a run id a list shows, from its end. Run ids are time-ordered (UUID
#: version 7): their first characters are the creation time, shared by every run started within
#: a minute or so, while the last ones are random, so they tell runs apart at a glance.
RUN_ID_SHOWN = 8


def short_run_id(run_id: object) -> str:
    """``run_id``'s last :data:`RUN_ID_SHOWN` characters after an ellipsis (``"…24f2c667"``)."""
    return "…" + str(run_id)[-RUN_ID_SHOWN:]


def run_url(run_id: object) -> str:
    """The URL of run ``run_id``'s admin page (``str``)."""
    return reverse("admin:django_leases_workflowrun_change", args=[str(run_id)])


def run_id_link(run_id: object) -> str:
    """A link to run ``run_id``'s admin page (safe HTML) showing :func:`short_run_id`, the
    whole id in its tooltip (``title``) and on the page it opens: a list column that fits at
    1280 px. ``"—"`` for ``None``."""
    if run_id is None:
        return "—"
    text = str(run_id)
    return format_html(
        '<a class="dl-id" href="{}" title="{}">{}</a>', run_url(text), text, short_run_id(text)
    )


def whole_run_id_link(run_id: object) -> str:
    """A link to run ``run_id``'s admin page (safe HTML) showing the whole id, for a run's
    page and a source's deliveries; ``"—"`` for ``None``."""
    if run_id is None:
        return "—"
    return format_html('<a href="{}">{}</a>', run_url(run_id), run_id)


def badge(
    element_id: str,
    data_name: str,
    value: str,
    background: str,
    colour: str,
    label: str | None = None,
) -> str:
    """A coloured status badge (safe HTML): ``<span id=element_id data_name=value>label</span>``,
    ``label`` being what the reader sees (the value's label in the active language; default
    ``value``) and ``value`` what tests and scripts read."""
    return format_html(
        '<span class="dl-status" id="{}" {}="{}" style="background:{};color:{};'
        'padding:1px 8px;border-radius:8px;font-weight:600;white-space:nowrap">{}</span>',
        element_id,
        data_name,
        value,
        background,
        colour,
        value if label is None else label,
    )


def choice_label(choices: type[models.TextChoices], value: str) -> str:
    """The label of ``value`` among ``choices`` in the active language; ``value`` itself when
    it is not one of them."""
    return str(choices(value).label) if value in choices.values else value


def cut_at_word(text: str, limit: int) -> str:
    """``text`` with its whitespace collapsed, cut to at most ``limit`` characters (an ``int``
    ≥ 2) at a word boundary with ``…`` appended when it was longer. A single word longer than
    the limit is cut inside (nothing better exists)."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    head = flat[: limit - 1]
    space = head.rfind(" ")
    if flat[limit - 1] != " " and space > 0:  # the cut falls inside a word: drop that word
        head = head[:space]
    return head.rstrip(" ,;:.") + "…"
