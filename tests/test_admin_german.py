"""Our admin pages in German: no English left on them.

The pages (as a superuser, ``LANGUAGE_CODE = "de"``): the run list and four run pages (a
run waiting on a sleep after a child run, a failed run, a completed run with a superseded
attempt, a run whose step waits on a queue), the lease list, the trigger-source list, a
source's page, the orphans and an orphan's page, the queue view, the schedules, the
workers, the deliveries and a delivery's page; and the messages of three operations (force
release a lease, pause a schedule, retry a failed step).

How English is told from data and from Django's own words:

* **Where.** A page's breadcrumbs, its messages and ``#content``. Django's header and the
  app list of its sidebar list every installed app (the demo's too); ours appear there under
  the names the breadcrumbs and titles already show.
* **What is read.** Text, and the attributes people read (``title``, ``placeholder``,
  ``aria-label``, a button's ``value``) — but not inside ``<code>`` or ``<pre>``, nor stored
  JSON (``.dl-json``): those are code (settings, commands, header names) and data, never
  translated. Not ``alt`` either: our pages have no images, and Django's icons are its own
  (its search icon's ``alt`` is not translated by Django).
* **Data.** Every value this test stores is spelled with the prefix ``zq`` (keys, holders,
  names, hosts, queues, events, delivery ids, the providers' details and states, JSON);
  ids (UUIDs, and the short ``…1b6c542a`` lists show), numbers, URLs and time zone names
  are data too, and so are the two identifiers the code itself stores as values: the source
  kind ``webhook`` and the queue ``default``. These are removed before words are compared.
  Rows the package wrote for itself while the test made its rows (the leases of runs and
  sources, whose holders name this machine; the demo project's declared sources) are deleted
  first.
* **English left.** A word of the German page that also occurs on the same page rendered in
  English (with the same rows) and occurs in no German translation of the catalogue Django
  has for ``de`` — Django's own and ours. Django's words are judged by the same rule and pass
  because Django translates them; words both languages share and our German uses ("Status",
  "Workflow", "Lease") pass for the same reason. Where Django leaves a string of its own
  untranslated in German (Django 6.1's admin has a few: "Pagination …", "Search …", "Run",
  "- Select an option -"), the text is Django's to translate, not ours: a text that is
  wholly one of those strings is set aside (:func:`django_untranslated`). Django 5.2 has
  none on our pages, so its run of this test is the strict one.
* **Pending.** :data:`PENDING` lists English known to be left unmarked (none now). Each
  entry must still be found on some page, so the list shrinks as strings are marked (an
  entry no longer found fails the test: delete it).
"""

from __future__ import annotations

import functools
import html.parser
import pathlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import translation

from django_leases.admin.leases import LeaseAdmin
from django_leases.clock import db_now_plus
from django_leases.models import (
    Lease,
    TriggerEvent,
    TriggerRefusal,
    TriggerSource,
    WorkflowRun,
    WorkflowSchedule,
    WorkflowStep,
    WorkflowWorker,
)
from django_leases.testing.providers import FakeProvider, installed_provider
from django_leases.triggers import lifecycle, registry
from django_leases.triggers.registry import webhook_source
from django_leases.workflows import send_event, step_function, workflow
from tests.helpers import drain, failed_run, lapse_lease

pytestmark = pytest.mark.django_db(transaction=True)

#: English known to be left unmarked (regular expressions, matched without regard to case).
#: Each must be found on some page: delete an entry once it is marked there.
PENDING: list[str] = []

#: Data: this test's values (``zq…``), URLs, ids, numbers, and the identifiers the code
#: stores as values.
DATA = re.compile(
    r"https?://\S+"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|…[0-9a-f]{8}\b"  # a run id as lists show it: its last 8 characters
    r"|\bzq[\w.:/-]*"
    r"|\b(?:webhook|default|UTC)\b"
    r"|\d+",
    re.IGNORECASE,
)
WORD = re.compile(r"[^\W\d_]+")
#: Placeholders and markup in a catalogue's translations: not words of the language.
NOT_WORDS = re.compile(r"%\(\w+\)[sdr]|%[sd]|\{\w*\}|<[^>]+>")

ATTRIBUTES = ("title", "placeholder", "aria-label")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}


class _Texts(html.parser.HTMLParser):
    """The texts people read in a page's breadcrumbs, messages and ``#content``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[bool, bool]] = []  # (in scope, skipped) per open element
        self.texts: list[str] = []

    def _state(self) -> tuple[bool, bool]:
        return self.stack[-1] if self.stack else (False, False)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        scope, skipped = self._state()
        scope = (
            scope
            or found.get("id") == "content"
            or bool({"breadcrumbs", "messagelist"} & set(classes))
        )
        skipped = skipped or tag in ("code", "pre", "script", "style") or "dl-json" in classes
        if scope and not skipped:
            self.texts += [value for name, value in attrs if name in ATTRIBUTES and value]
            button = tag == "button" or found.get("type") in ("submit", "button")
            if tag == "input" and button and found.get("value"):
                self.texts.append(str(found["value"]))
        if tag not in VOID:
            self.stack.append((scope, skipped))

    def handle_endtag(self, tag: str) -> None:
        if tag not in VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        scope, skipped = self._state()
        if scope and not skipped and data.strip():
            self.texts.append(data)


def texts(page: str, *, data: bool = False) -> list[str]:
    """What people read on ``page`` (HTML) where our strings are, data removed (kept with
    ``data``)."""
    parser = _Texts()
    parser.feed(page)
    return [" ".join((text if data else DATA.sub(" ", text)).split()) for text in parser.texts]


def words(texts: list[str]) -> set[str]:
    return {word.lower() for text in texts for word in WORD.findall(text)}


def german_words() -> set[str]:
    """Every word of the German catalogue Django has (its own and every app's, ours too)."""
    catalogue = translation.trans_real.translation("de")._catalog  # type: ignore[attr-defined]
    found: set[str] = set()
    for _key, text in catalogue.items():
        found |= {word.lower() for word in WORD.findall(NOT_WORDS.sub(" ", str(text)))}
    return found


#: An entry of a ``.po`` file: its msgid (with the quoted lines that continue it) and its
#: first msgstr (``msgstr`` or ``msgstr[0]``), likewise.
ENTRY = re.compile(
    r'^msgid "(.*)"\n((?:".*"\n)*)(?:msgid_plural .*\n(?:".*"\n)*)?'
    r'msgstr(?:\[0\])? "(.*)"\n((?:".*"\n)*)',
    re.MULTILINE,
)
PLACEHOLDER = re.compile(r"%\(\w+\)[sdr]|%[sd]")


def _po_entries(path: pathlib.Path) -> dict[str, str]:
    """A ``.po`` file's entries: msgid -> first msgstr (empty where untranslated)."""
    found = {}
    for match in ENTRY.finditer(path.read_text(encoding="utf-8")):
        msgid = match[1] + "".join(line[1:-1] for line in match[2].splitlines())
        msgstr = match[3] + "".join(line[1:-1] for line in match[4].splitlines())
        if msgid:
            found[msgid.replace('\\"', '"')] = msgstr
    return found


@functools.cache
def django_untranslated() -> re.Pattern[str]:
    """Django's own admin strings that its German catalogues leave in English, as one
    pattern a whole text must match (placeholders match anything).

    Django ships an ``en`` catalogue beside each ``de`` one, listing every msgid; a msgid the
    ``de`` file lacks or leaves empty is one Django has not translated yet. Only Django's
    own (``django.conf`` and ``django.contrib.admin``) catalogues are read."""
    root = pathlib.Path(django.__file__).parent
    english: list[str] = []
    for folder in (root / "conf", root / "contrib" / "admin"):
        for en in (folder / "locale" / "en" / "LC_MESSAGES").glob("*.po"):
            de = _po_entries(folder / "locale" / "de" / "LC_MESSAGES" / en.name)
            english += [msgid for msgid in _po_entries(en) if not de.get(msgid)]
    patterns = [
        ".+?".join(re.escape(" ".join(part.split())) for part in PLACEHOLDER.split(msgid))
        for msgid in english
        if msgid.strip()
    ]
    return re.compile("|".join(f"(?:{pattern})" for pattern in patterns) or "(?!)")


def english_left(german: str, english: str, pending: set[str]) -> set[str]:
    """The words of ``german`` (a page rendered in German) that are English: on ``english``
    (the same page in English) too, and in no German translation. Text a :data:`PENDING`
    pattern matches is set aside (the patterns matched are added to ``pending``)."""
    read = []
    for text in texts(german, data=True):
        if django_untranslated().fullmatch(text):
            continue
        for pattern in PENDING:
            if re.search(pattern, text, re.IGNORECASE):
                pending.add(pattern)
                text = re.sub(pattern, " ", text, flags=re.IGNORECASE)
        read.append(DATA.sub(" ", text))
    return (words(read) & words(texts(english))) - german_words()


# -- the rows the pages show --------------------------------------------------------------------


@step_function("zq.schritt")
def schritt(data: Any, ctx: Any) -> Any:
    return {"zq": "zq-ergebnis"}


@workflow("zq.kindfluss")
def kindfluss(run: Any, input: Any) -> Any:
    return run.step("zq-kindschritt", "zq.schritt", {})


@workflow("zq.fluss")
def fluss(run: Any, input: Any) -> Any:
    run.step("zq-schritt", "zq.schritt", {"zq": "zq-daten"})
    run.child("zq-kind", "zq.kindfluss", {"zq": "zq-kindeingabe"})
    run.sleep("zq-schlaf", 3600)
    return run.wait_for_event("zq-signal")


def _worker(host: str, pid: int, *, queues: list[str]) -> WorkflowWorker:
    key = f"zq-herzschlag:{host}:{pid}"
    row = WorkflowWorker.objects.register(
        key, host=host, pid=pid, concurrency=4, queues=queues, wakeup="zq-wecker"
    )
    assert Lease.objects.acquire(key, f"zq-{host}:{pid}", ttl=600) is not None
    WorkflowWorker.objects.beat(key, 1)
    return row


@pytest.fixture
def rows() -> Iterator[dict[str, Any]]:
    """A row of every kind the pages show, in every state they tell apart."""
    found: dict[str, Any] = {}
    # Leases: live, lapsed, released.
    assert Lease.objects.acquire("zq-nachtlauf", holder="zq-knoten-1", ttl=600) is not None
    assert Lease.objects.acquire("zq-abgelaufen", holder="zq-knoten-2", ttl=600) is not None
    lapse_lease("zq-abgelaufen")
    released = Lease.objects.acquire("zq-frei", holder="zq-knoten-3", ttl=600)
    assert released is not None
    Lease.objects.release(released)
    # Runs: one waiting (a step, a finished child, a sleep, an event sent early), one failed,
    # one completed whose step had a superseded attempt.
    waiting = WorkflowRun.objects.start("zq.fluss", {"zq": "zq-eingabe"})
    drain()
    send_event(waiting.id, "zq-signal", {"zq": "zq-nutzlast"})
    found["waiting"] = waiting
    found["failed"] = failed_run("zq.fehlfluss", "zq-bruch", "zq.schritt", {"zq": "zq-fehler"})
    done = WorkflowRun.objects.start("zq.ablosefluss", {})
    WorkflowStep.objects.schedule(done.id, "zq-abholen", "zq.abholen", {}, queue="zq-schlange")
    first = WorkflowStep.objects.claim_for_execution(done.id, "zq-abholen", "zq.abholen", 60)
    assert first is not None
    WorkflowStep.objects.filter(pk=first.step_id).update(lease_expires_at=db_now_plus(-1))
    second = WorkflowStep.objects.claim_for_execution(done.id, "zq-abholen", "zq.abholen", 60)
    assert second is not None
    WorkflowStep.objects.set_result(second.step_id, {"zq": "zq-ok"}, second.attempt)
    WorkflowRun.objects.complete(done.id, {"zq": "zq-ausgabe"})
    found["done"] = done
    # A step waiting on a queue the settings do not name.
    later = WorkflowRun.objects.start("zq.spaeter", {})
    WorkflowStep.objects.schedule(later.id, "zq-wartet", "zq.schritt", {}, queue="zq-frei")
    found["queued"] = later
    # Schedules: active, paused, undeclared.
    for name, paused, declared in (
        ("zq-plan", False, True),
        ("zq-pause", True, True),
        ("zq-alt", False, False),
    ):
        WorkflowSchedule.objects.create(
            name=name,
            workflow="zq.fluss",
            cron="0 3 * * *",
            paused=paused,
            declared=declared,
            input={"zq": "zq-plan"},
            next_tick=db_now_plus(3600),
            last_tick=db_now_plus(-3600),
            last_run_id=waiting.id,
        )
    # Workers: live, stopped, lapsed.
    _worker("zq-wirt-a", 101, queues=["zq-schlange"])
    stopped = _worker("zq-wirt-b", 102, queues=[])
    Lease.objects.release(Lease.objects.current(stopped.lease_key))
    WorkflowWorker.objects.stopped(stopped.lease_key)
    lapsed = _worker("zq-wirt-c", 103, queues=[])
    lapse_lease(lapsed.lease_key)
    # Trigger sources: one on, one off (no secret), one orphan; deliveries and refusals.
    with installed_provider(FakeProvider("zq-anbieter")):
        for name in ("zq-quelle", "zq-aus", "zq-waise"):
            webhook_source(name, provider="zq-anbieter", config={"zq": "zq-konf"}, events={})
        try:
            lifecycle.reconcile(base_url="https://zq.example/")
            lifecycle.enable("zq-quelle")
            lifecycle.enable("zq-waise")
            registry.unregister("zq-waise")
            lifecycle.reconcile()
            TriggerSource.objects.exclude(name__startswith="zq-").delete()  # the demo's
            # What providers and the lifecycle recorded is stored text: data here.
            TriggerSource.objects.update(detail="zq-detail", state={"zq": "zq-zustand"})
            TriggerSource.objects.filter(name="zq-aus").update(state=None)
            source = TriggerSource.objects.get(name="zq-quelle")
            found["source"] = source
            found["orphan"] = TriggerSource.objects.get(name="zq-waise")
            TriggerRefusal.objects.tally("zq-quelle", "bad_signature", 401)
            found["delivery"] = TriggerEvent.objects.create(
                source=source,
                source_name="zq-quelle",
                delivery_id="zq-lieferung-1",
                event="zq-push",
                payload={"zq": "zq-nutzlast"},
                run=waiting,
                outcome="zq-gesagt",
            )
            TriggerEvent.objects.create(
                source=source,
                source_name="zq-quelle",
                delivery_id="zq-lieferung-2",
                event="zq-push",
                payload={"zq": "zq-nutzlast"},
            )
            Lease.objects.exclude(key__startswith="zq-").delete()
            yield found
        finally:
            for name in ("zq-quelle", "zq-aus"):
                registry.unregister(name)


def pages(rows: dict[str, Any]) -> dict[str, str]:
    """The pages to read, by a name: their URLs."""

    def page(name: str, *args: Any) -> str:
        return reverse(f"admin:django_leases_{name}", args=args)

    return {
        "run list": page("workflowrun_changelist"),
        "waiting run": page("workflowrun_change", rows["waiting"].pk),
        "failed run": page("workflowrun_change", rows["failed"].pk),
        "completed run": page("workflowrun_change", rows["done"].pk),
        "queued run": page("workflowrun_change", rows["queued"].pk),
        "lease list": page("lease_changelist"),
        "trigger sources": page("triggersource_changelist"),
        "trigger source": page("triggersource_change", rows["source"].pk),
        "orphans": page("orphantriggersource_changelist"),
        "orphan": page("orphantriggersource_change", rows["orphan"].pk),
        "queues": page("workflowqueue_changelist"),
        "schedules": page("workflowschedule_changelist"),
        "workers": page("workflowworker_changelist"),
        "deliveries": page("triggerevent_changelist"),
        "delivery": page("triggerevent_change", rows["delivery"].pk),
    }


QUEUES = {"zq-schlange": {"concurrency": 2, "rate": "5/s"}}


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("zq-admin", password="pw"))
    return client


def rendered(client: Client, language: str, url: str) -> str:
    with override_settings(LANGUAGE_CODE=language), translation.override(language):
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def operated(client: Client, language: str, url: str, data: dict[str, Any]) -> str:
    """The page an operation's POST leads to (its messages on it), in ``language``."""
    with override_settings(LANGUAGE_CODE=language), translation.override(language):
        response = client.post(url, data, follow=True)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def test_our_admin_pages_show_no_english_in_german(
    admin: Client, rows: dict[str, Any], settings: Any
) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "QUEUES": QUEUES}
    left: dict[str, set[str]] = {}
    pending: set[str] = set()
    for name, url in pages(rows).items():
        german = rendered(admin, "de", url)
        assert 'lang="de"' in german, name
        english = rendered(admin, "en", url)
        left[name] = english_left(german, english, pending)
    english = {name: sorted(found) for name, found in left.items() if found}
    assert english == {}, "\n".join(f"{name}: {found}" for name, found in english.items())
    unused = [pattern for pattern in PENDING if pattern not in pending]
    assert unused == [], "marked for translation since: delete these from PENDING"


def messages(page: str) -> list[str]:
    """The texts of ``page``'s messages (data removed)."""
    found = re.findall(r'<ul class="messagelist">.*?</ul>', page, re.S)
    return texts("".join(found), data=True)


def test_the_operations_say_what_they_did_in_german(admin: Client, rows: dict[str, Any]) -> None:
    """A message is ours from end to end, so every word of it (data aside) must be German:
    a word of the German catalogue."""
    lease = Lease.objects.get(key="zq-nachtlauf")
    schedule = WorkflowSchedule.objects.get(name="zq-plan")
    failed = rows["failed"]
    operations = [
        (
            reverse("admin:django_leases_lease_changelist"),
            {"action": "force_release", "_selected_action": [str(lease.pk)]},
        ),
        (
            reverse("admin:django_leases_workflowschedule_changelist"),
            {"action": "pause", "_selected_action": [str(schedule.pk)]},
        ),
        (
            reverse("admin:django_leases_workflowrun_operate", args=[failed.pk, "retry-step"]),
            {"step": "zq-bruch"},
        ),
    ]
    said = [messages(operated(admin, "de", url, data)) for url, data in operations]
    assert said == [
        ["1 Lease zwangsweise freigegeben: zq-nachtlauf."],
        ["1 Zeitplan pausiert: zq-plan."],
        [
            f"Lauf {failed.pk}: Fehlgeschlagen → Läuft; Schritt 'zq-bruch' als neuer Versuch"
            " wieder fällig."
        ],
    ]
    told = [DATA.sub(" ", text) for texts in said for text in texts]
    assert words(told) - german_words() == set()


def test_the_check_finds_an_unmarked_string(
    admin: Client, rows: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison can fail: a column heading left unmarked is found."""
    monkeypatch.setattr(LeaseAdmin.time_left, "short_description", "seconds remaining")
    url = reverse("admin:django_leases_lease_changelist")
    pending: set[str] = set()
    found = english_left(rendered(admin, "de", url), rendered(admin, "en", url), pending)
    assert found == {"seconds", "remaining"}


def test_data_and_code_are_not_read() -> None:
    page = (
        '<div id="content"><p>Schlüssel zq-nachtlauf 42 '
        f"{uuid.uuid4()} https://zq.example/hooks/x/</p>"
        '<code>manage.py trigger_sources</code><span class="dl-json">{"type": 1}</span>'
        '<input type="submit" value="Lauf fortsetzen"><input type="hidden" value="secret">'
        '</div><p id="elsewhere">Django administration</p>'
    )
    assert texts(page) == ["Schlüssel", "Lauf fortsetzen"]
