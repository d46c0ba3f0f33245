"""Refused deliveries are counted per source and reason, and every delivery sends a signal.

Nothing of a refused delivery is kept but its tally (``TriggerRefusal``: reason, count,
last status, first and last time); a name no source row has is never counted, so a scan of
random addresses adds no rows. Both backends; the racing test runs real threads.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client

from django_leases import signals
from django_leases.models import TriggerEvent, TriggerRefusal, TriggerSource, WorkflowRun
from django_leases.triggers import registry
from django_leases.triggers.registry import Delivery, webhook_source
from django_leases.triggers.signatures import github_signature
from django_leases.triggers.values import REFUSAL_REASONS
from tests.helpers import race

SOURCE = "test-refusals"
SECRET = "refusals-signing-secret-0123456789"
URL = f"/hooks/{SOURCE}/"


def _fail(delivery: Delivery) -> None:
    raise RuntimeError("the handler failed")


def _accept(delivery: Delivery) -> None:
    return None


@pytest.fixture
def source(settings: Any, transactional_db: None) -> Iterator[str]:
    """An enabled GitHub source with a known secret; ``issues`` deliveries fail in the
    handler."""
    webhook_source(SOURCE, provider="github", events={"push": _accept, "issues": _fail})
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}, "WEBHOOK_MAX_BODY": 4096}
    TriggerSource.objects.sync(registry.declarations())
    TriggerSource.objects.set_enabled(SOURCE, True)
    yield SOURCE
    registry.unregister(SOURCE)


@pytest.fixture
def sent() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """The delivery signals sent during the test: (signal name, arguments)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def on(name: str) -> Any:
        def receiver(sender: Any, signal: Any, **kwargs: Any) -> None:
            assert sender is TriggerEvent
            seen.append((name, kwargs))

        return receiver

    accepted, refused = on("accepted"), on("refused")
    signals.delivery_accepted.connect(accepted)
    signals.delivery_refused.connect(refused)
    yield seen
    signals.delivery_accepted.disconnect(accepted)
    signals.delivery_refused.disconnect(refused)


BODY = b'{"zen": "Keep it logically awesome.", "ref": "refs/heads/main"}'


def _headers(
    body: bytes = BODY, *, event: str = "push", secret: str = SECRET, **extra: str
) -> dict[str, str]:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": github_signature(secret, body),
        **extra,
    }


def _post(body: bytes, headers: dict[str, str], url: str = URL, **extra: Any) -> Any:
    return Client().post(url, data=body, content_type="application/json", headers=headers, **extra)


def _tallies(name: str = SOURCE) -> dict[str, tuple[int, int]]:
    return {
        reason: (row.count, row.last_status)
        for reason, row in TriggerRefusal.objects.by_source([name]).get(name, {}).items()
    }


def test_each_refusal_is_counted_under_its_reason(
    source: str, sent: list[tuple[str, dict[str, Any]]], settings: Any
) -> None:
    cases: list[tuple[str, bytes, dict[str, str], dict[str, Any]]] = [
        ("bad_request", BODY, _headers(), {"CONTENT_LENGTH": "+64"}),
        (
            "bad_request",
            BODY,
            {**_headers(), "X-GitHub-Delivery": "one, two"},
            {},
        ),
        ("too_large", b"x" * 5000, _headers(b"x" * 5000), {}),
        ("bad_signature", BODY, _headers(secret="not-the-secret"), {}),
        ("bad_signature", BODY, {"X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1"}, {}),
        ("malformed", b"[1, 2]", _headers(b"[1, 2]"), {}),
        ("not_recorded", BODY, _headers(event="issues"), {}),
    ]
    for reason, body, headers, extra in cases:
        response = _post(body, headers, **extra)
        assert response.status_code == REFUSAL_REASONS[reason][0], (reason, response.content)

    assert _tallies() == {
        "bad_request": (2, 400),
        "too_large": (1, 413),
        "bad_signature": (2, 401),
        "malformed": (1, 400),
        "not_recorded": (1, 500),
    }
    assert [(name, kw["reason"], kw["status"]) for name, kw in sent] == [
        ("refused", reason, REFUSAL_REASONS[reason][0]) for reason, *_ in cases
    ]
    assert all(kw["source"] == SOURCE for _, kw in sent)
    # Nothing of them was kept: no delivery, no run, and the tallies hold no request data.
    assert TriggerEvent.objects.count() == 0
    assert WorkflowRun.objects.count() == 0
    stored = {f.name for f in TriggerRefusal._meta.get_fields()}
    assert stored == {
        "id",
        "source",
        "reason",
        "count",
        "last_status",
        "first_refused_at",
        "last_refused_at",
    }

    # No secret at all for the source: its own reason.
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {}}
    assert _post(BODY, _headers()).status_code == 401
    assert _tallies()["no_secret"] == (1, 401)


def test_a_disabled_source_counts_its_refusals_and_an_unknown_name_adds_no_row(
    source: str, sent: list[tuple[str, dict[str, Any]]]
) -> None:
    TriggerSource.objects.set_enabled(SOURCE, False)
    for _ in range(3):
        assert _post(BODY, _headers()).status_code == 404
    assert _tallies() == {"not_receiving": (3, 404)}

    for n in range(5):
        assert _post(BODY, _headers(), url=f"/hooks/scan-{n}/").status_code == 404
    assert TriggerRefusal.objects.count() == 1  # only the known source's row
    assert [kw["source"] for _, kw in sent[3:]] == [f"scan-{n}" for n in range(5)]
    assert TriggerRefusal.objects.tally("scan-0", "not_receiving", 404) is False


@pytest.mark.parametrize(
    "name",
    ["te%00st", "%00", "test-pushes%00", "a%ED%A0%80b", "x" * 300],
    ids=["nul", "only-nul", "source-and-nul", "surrogate-bytes", "too-long"],
)
def test_a_name_no_source_can_have_is_a_quiet_404(
    source: str,
    sent: list[tuple[str, dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    """A hook URL whose name no source row can have (a NUL, which PostgreSQL cannot even
    compare, bytes that are not UTF-8, over 200 characters) is a 404 like any unknown name:
    no traceback in the log (the name is not looked up, nor counted), only the one line
    Django writes for every 404."""
    with caplog.at_level("DEBUG"):
        response = _post(BODY, _headers(), url=f"/hooks/{name}/")
    assert response.status_code == 404
    assert "error" in response.json()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= 30 and r.name != "django.request"]
    assert TriggerRefusal.objects.count() == 0
    assert [kw["reason"] for _, kw in sent] == ["not_receiving"]
    assert TriggerRefusal.objects.tally(SOURCE + "\x00", "not_receiving", 404) is False


def test_accepted_and_repeated_deliveries_signal_and_count_nothing(
    source: str, sent: list[tuple[str, dict[str, Any]]]
) -> None:
    headers = _headers()
    assert _post(BODY, headers).status_code == 202
    assert _post(BODY, headers).status_code == 200
    event = TriggerEvent.objects.get()
    assert sent == [
        (
            name,
            {
                "source": SOURCE,
                "event": "push",
                "delivery_id": headers["X-GitHub-Delivery"],
                "run_id": None,
                "duplicate": duplicate,
            },
        )
        for name, duplicate in (("accepted", False), ("accepted", True))
    ]
    assert event.delivery_id == headers["X-GitHub-Delivery"]
    assert TriggerRefusal.objects.count() == 0


def test_a_tally_that_cannot_be_written_changes_no_answer(
    source: str,
    sent: list[tuple[str, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(type(TriggerRefusal.objects), "tally", broken)
    with caplog.at_level(logging.WARNING, logger="django_leases.triggers"):
        response = _post(BODY, _headers(secret="wrong-secret"))
    assert response.status_code == 401
    assert "could not be counted" in caplog.text
    assert [kw["reason"] for _, kw in sent] == ["bad_signature"]


def test_a_receiver_that_raises_changes_no_answer(source: str) -> None:
    def explode(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a receiver failed")

    signals.delivery_accepted.connect(explode)
    signals.delivery_refused.connect(explode)
    try:
        assert _post(BODY, _headers()).status_code == 202
        assert _post(BODY, _headers(secret="wrong")).status_code == 401
    finally:
        signals.delivery_accepted.disconnect(explode)
        signals.delivery_refused.disconnect(explode)
    assert _tallies() == {"bad_signature": (1, 401)}


def test_racing_first_refusals_are_each_counted(source: str) -> None:
    """Threads released together by a barrier all tally the same new (source, reason): the
    insert only one wins is counted by the others' update, so none is lost."""
    threads = 4 if connection.vendor == "sqlite" else 12
    for reason in ("malformed", "too_large", "bad_request"):
        results = race(
            [lambda reason=reason: TriggerRefusal.objects.tally(SOURCE, reason, 400)] * threads
        )
        assert results == [True] * threads
        assert _tallies()[reason] == (threads, 400)


def test_an_unknown_reason_is_refused(source: str) -> None:
    with pytest.raises(ValueError, match="Unknown refusal reason"):
        TriggerRefusal.objects.tally(SOURCE, "because", 400)


def test_receiving_is_outside_atomic_requests(source: str) -> None:
    """With ``ATOMIC_REQUESTS`` the handler still runs in the receiver's own transaction only,
    so a 202 is committed when it is answered (and a refusal's tally is kept)."""
    depth: list[int] = []

    def handler(delivery: Delivery) -> None:
        depth.append(len(connections[delivery.using].atomic_blocks))

    registry.unregister(SOURCE)
    webhook_source(SOURCE, provider="github", events={"push": handler})
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        assert _post(BODY, _headers()).status_code == 202
        assert _post(BODY, _headers(secret="wrong")).status_code == 401
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False
    assert depth == [1]
    assert _tallies() == {"bad_signature": (1, 401)}


def test_an_enabled_source_this_process_does_not_declare_is_a_503_of_its_own_reason(
    source: str, sent: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    """A web process of the previous deploy (no declaration of the source) while the row
    is declared and enabled: not counted as ``not_receiving`` (documented as "disabled"),
    but as ``not_declared_here``, answered 503 so the sender delivers again."""
    registry.unregister(SOURCE)
    try:
        with caplog.at_level("WARNING", logger="django_leases.triggers"):
            response = _post(BODY, _headers())
    finally:
        webhook_source(SOURCE, provider="github", events={"push": _accept, "issues": _fail})
    assert response.status_code == 503
    assert "not declared in this process" in response.json()["error"]
    assert _tallies() == {"not_declared_here": (1, 503)}
    assert [kw["reason"] for _, kw in sent] == ["not_declared_here"]
    assert "no declaration of it" in caplog.text
    assert TriggerEvent.objects.count() == 0
    # Disabled, the same process answers the plain 404 again.
    TriggerSource.objects.set_enabled(SOURCE, False)
    registry.unregister(SOURCE)
    try:
        assert _post(BODY, _headers()).status_code == 404
    finally:
        webhook_source(SOURCE, provider="github", events={"push": _accept, "issues": _fail})
    assert _tallies()["not_receiving"] == (1, 404)
