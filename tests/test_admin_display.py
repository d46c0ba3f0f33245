"""How the admin pages show values: whole-word cuts, one localized time format."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

from django_leases.admin.display import cut_at_word, local_time
from django_leases.models import TriggerSource

WORDS = "Setup failed: the provider answered 422 Unprocessable Entity because the hook exists"


def test_cut_at_word_keeps_whole_words() -> None:
    assert cut_at_word(WORDS, 200) == WORDS
    cut = cut_at_word(WORDS, 40)
    assert len(cut) <= 40 and cut.endswith("…")
    assert WORDS.startswith(cut[:-1]) and WORDS[len(cut) - 1] == " ", cut
    assert cut == "Setup failed: the provider answered 422…"
    assert cut_at_word("a  b\n\tc", 10) == "a b c"
    assert cut_at_word("x" * 50, 10) == "x" * 9 + "…"  # one long word: nothing better


def test_local_time_is_djangos_localized_format_in_the_current_time_zone() -> None:
    moment = datetime(2026, 12, 1, 13, 5, 9, 250_000, tzinfo=UTC)
    with timezone.override("Europe/Paris"), translation.override("en"):
        html = str(local_time(moment))
    assert ">Dec. 1, 2026, 2:05 p.m.</time>" in html
    assert 'datetime="2026-12-01T14:05:09.250000+01:00"' in html
    assert 'title="2026-12-01 14:05:09.250+01:00"' in html
    with timezone.override("UTC"), translation.override("de"):
        assert re.search(r">1\. Dezember 2026 13:05</time>", str(local_time(moment)))
    assert local_time(None) == "—"


@pytest.mark.django_db
def test_the_sources_list_cuts_a_long_detail_at_a_word(admin_client: Client) -> None:
    detail = "Could not register the webhook: " + " ".join(["unprocessable"] * 20)
    TriggerSource.objects.create(name="cut-detail", provider="fake", declared=True, detail=detail)
    html = admin_client.get(reverse("admin:django_leases_triggersource_changelist")).content
    cell = re.search(r'<td class="field-short_detail">(.*?)</td>', html.decode(), re.S)
    assert cell is not None
    shown = cell.group(1)
    assert shown.endswith("unprocessable…"), shown
    assert len(shown) <= 100
