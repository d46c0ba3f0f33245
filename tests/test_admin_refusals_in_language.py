"""The admin's refusals and bulk summaries, in German and French.

``tests/test_admin_german.py`` reads three successful operations in German. A refusal carries
the store's exception message (``WorkflowRunStateError``, ``WorkflowEventRefusedError``, made
with ``gettext`` where it is raised, the status by its label), and a bulk summary names the
statuses it reached: every word of these messages (data aside: ids, numbers, ``zq…`` values)
is a word of the active language's catalogue, not English in a German sentence.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import translation

from django_leases.models import WorkflowRun
from django_leases.workflows import step_function, workflow
from tests.helpers import drain
from tests.test_admin_german import DATA, NOT_WORDS, WORD, messages, operated, words

pytestmark = pytest.mark.django_db(transaction=True)


@step_function("zq.refusal-step")
def refusal_step(data: Any, ctx: Any) -> Any:
    return {"zq": "zq-ok"}


@workflow("zq.refusal-flow")
def refusal_flow(run: Any, input: Any) -> Any:
    return run.step("zq-a", "zq.refusal-step", {})


def catalogue_words(language: str) -> set[str]:
    """Every word of the catalogue Django has for ``language`` (its own and every app's)."""
    catalogue = translation.trans_real.translation(language)._catalog  # type: ignore[attr-defined]
    found: set[str] = set()
    for _key, text in catalogue.items():
        found |= {word.lower() for word in WORD.findall(NOT_WORDS.sub(" ", str(text)))}
    return found


def english_in(said: list[str], language: str) -> set[str]:
    return words([DATA.sub(" ", text) for text in said]) - catalogue_words(language)


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("zq-refusals", password="pw"))
    return client


def completed_run() -> WorkflowRun:
    run = WorkflowRun.objects.start("zq.refusal-flow", {})
    drain()
    run.refresh_from_db()
    assert run.status == "completed"
    return run


@pytest.mark.parametrize("language", ["de", "fr"])
def test_a_refused_resume_is_said_in_the_admins_language(admin: Client, language: str) -> None:
    """Resuming a completed run from its page is refused: ``Nothing changed: %(error)s.``
    with ``WorkflowRunStateError``'s text ("Run … is completed: only … can be resumed")."""
    run = completed_run()
    url = reverse("admin:django_leases_workflowrun_operate", args=[run.pk, "resume"])
    said = messages(operated(admin, language, url, {}))
    assert said, "no message"
    assert english_in(said, language) == set(), said


@pytest.mark.parametrize("language", ["de", "fr"])
def test_a_refused_event_is_said_in_the_admins_language(admin: Client, language: str) -> None:
    """Sending an event to a completed run is refused: ``Nothing sent: %(error)s.`` with the
    store's reason."""
    run = completed_run()
    url = reverse("admin:django_leases_workflowrun_operate", args=[run.pk, "send-event"])
    said = messages(operated(admin, language, url, {"name": "zq-signal", "payload": "{}"}))
    assert said, "no message"
    assert english_in(said, language) == set(), said


@pytest.mark.parametrize("language", ["de", "fr"])
def test_a_bulk_summary_names_statuses_in_the_admins_language(admin: Client, language: str) -> None:
    """Cancelling more than ``MESSAGES_PER_RUN`` (10) runs at once gives one summary:
    ``%(count)d runs changed`` followed by each status reached, by its label, and a count."""
    runs = [WorkflowRun.objects.start("zq.refusal-flow", {}) for _ in range(11)]
    url = reverse("admin:django_leases_workflowrun_changelist")
    data = {"action": "cancel_runs", "_selected_action": [str(run.pk) for run in runs]}
    said = messages(operated(admin, language, url, data))
    assert said and re.search(r"\d", said[0]), said
    assert english_in(said, language) == set(), said
