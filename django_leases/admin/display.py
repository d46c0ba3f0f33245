"""How the django-leases admin pages show values: one time format, badges, whole-word cuts.

Times: every time on these pages is shown in the current time zone (Django's
``TIME_ZONE``, or the one a middleware activated) as ``2026-12-01 13:12:05 UTC`` — with
seconds, which an attempt history needs, and the same everywhere (lists, pages, tables). The
element is a ``<time>`` whose ``datetime`` attribute holds the ISO 8601 value.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.html import format_html

#: The one format of times on the admin pages (Django's date-format characters).
TIME_FORMAT = "Y-m-d H:i:s T"


def local_time(value: datetime | None) -> str:
    """``value`` (a ``datetime``, aware or naive, or ``None``) as safe HTML in the current time
    zone and :data:`TIME_FORMAT`; ``"—"`` for ``None``."""
    if value is None:
        return "—"
    shown = timezone.localtime(value) if timezone.is_aware(value) else value
    return format_html(
        '<time class="dl-time" datetime="{}">{}</time>',
        shown.isoformat(),
        date_format(shown, TIME_FORMAT),
    )


def badge(element_id: str, data_name: str, value: str, background: str, colour: str) -> str:
    """A coloured status badge (safe HTML): ``<span id=element_id data_name=value>value</span>``."""
    return format_html(
        '<span class="dl-status" id="{}" {}="{}" style="background:{};color:{};'
        'padding:1px 8px;border-radius:8px;font-weight:600;white-space:nowrap">{}</span>',
        element_id,
        data_name,
        value,
        background,
        colour,
        value,
    )


def cut_at_word(text: str, limit: int) -> str:
    """``text`` with its whitespace collapsed, cut to at most ``limit`` characters (an ``int``
    ≥ 2) at a word boundary with ``…`` appended when it was longer. A single word longer than
    the limit is cut inside (nothing better exists)."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    head = flat[: limit - 1]
    space = head.rfind(" ")
    if space > 0:
        head = head[:space]
    return head.rstrip(" ,;:.") + "…"
