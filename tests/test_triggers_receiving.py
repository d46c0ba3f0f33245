"""``POST hooks/<name>/``: the receiving matrix over GitHub and Stripe deliveries, both backends.

Deliveries are our own payloads (``tests/fixtures/``), signed as the providers sign them
(``X-Hub-Signature-256`` over the exact file bytes, ``Stripe-Signature`` over ``t.body``) and
sent with the headers the providers send (``tests/payloads.py``). The tests that take every
payload of a kind run once more over the real payloads in ``../shared/fixtures/``, with the
example headers of that folder's manifest.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import time_machine
from cryptography.fernet import Fernet
from django.db import connection
from django.test import Client, RequestFactory

from django_leases.models import TriggerEvent, TriggerSource, WorkflowRun
from django_leases.triggers import registry
from django_leases.triggers.credentials import set_secret
from django_leases.triggers.registry import Delivery, StartWorkflow, webhook_source
from django_leases.triggers.signatures import github_signature, stripe_signature
from django_leases.triggers.views import receive_webhook
from django_leases.workflows import workflow
from tests.helpers import ROOT, on_another_thread, race, raw_request, start_blocked
from tests.payloads import PayloadSet, ours

SOURCE = "test-pushes"
SECRET = ours().github_secret  # our deliveries are signed with it
WORKFLOW = "test-trigger-build"
URL = f"/hooks/{SOURCE}/"


@workflow(WORKFLOW)
def _build(run: Any, input: Any) -> Any:
    return input


_function_calls: list[Delivery] = []


def _on_issue(delivery: Delivery) -> None:
    _function_calls.append(delivery)


@pytest.fixture
def source(settings: Any, db: None) -> Iterator[str]:
    """The test source: declared, synced, enabled, with our deliveries' GitHub secret."""
    webhook_source(
        SOURCE,
        provider="github",
        config={"repository": "octo-org/octo-repo"},
        events={
            "push": StartWorkflow(WORKFLOW),
            "release": StartWorkflow(WORKFLOW, input="delivery"),
            "issues": _on_issue,
            "create": StartWorkflow(WORKFLOW, key=lambda d: d.payload["ref"]),
        },
    )
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}}
    TriggerSource.objects.sync(registry.declarations())
    TriggerSource.objects.set_enabled(SOURCE, True)
    _function_calls.clear()
    yield SOURCE
    registry.unregister(SOURCE)


def _example(name: str = "push/to-main") -> tuple[bytes, dict[str, str]]:
    """One of our GitHub deliveries (``tests/fixtures/github/<name>.json``): body, headers."""
    sample = ours().one(f"github/{name}.json")
    return sample.body, sample.header_copy()


def _use_secret_of(payloads: PayloadSet, settings: Any) -> None:
    """The test source verifies with the secret ``payloads`` are signed with."""
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: payloads.github_secret}}


def _post(
    client: Client, body: bytes, headers: dict[str, str], url: str = URL, **extra: Any
) -> Any:
    headers = dict(headers)
    content_type = headers.pop("Content-Type", "application/json")
    return client.post(url, data=body, content_type=content_type, headers=headers, **extra)


def _signed(body: bytes, event: str = "push", delivery: str | None = None) -> dict[str, str]:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Hook-ID": "12345678",
        "User-Agent": "GitHub-Hookshot/044aadd",
        "X-Hub-Signature-256": github_signature(SECRET, body),
        "Content-Type": "application/json",
    }


def _nothing_recorded() -> None:
    assert TriggerEvent.objects.count() == 0
    assert WorkflowRun.objects.count() == 0


# -- accepted deliveries ------------------------------------------------------------------------


def test_every_push_starts_one_run(source: str, payload_set: PayloadSet, settings: Any) -> None:
    _use_secret_of(payload_set, settings)
    client = Client()
    pushes = payload_set.github("push")
    assert len(pushes) >= 4
    for push in pushes:
        response = _post(client, push.body, push.headers)
        assert response.status_code == 202, (push.name, response.content)
        answer = response.json()
        assert answer["status"] == "accepted"
        assert answer["delivery"] == push.delivery_id
        event = TriggerEvent.objects.get(source_name=SOURCE, delivery_id=push.delivery_id)
        assert answer["event_id"] == event.pk
        assert event.event == "push"
        assert event.payload == push.payload
        assert event.source == TriggerSource.objects.get(name=SOURCE)
        run = WorkflowRun.objects.get(pk=answer["run_id"])
        assert event.run_id == run.pk
        assert run.workflow == WORKFLOW
        assert run.input == push.payload
    assert TriggerEvent.objects.count() == len(pushes)
    assert WorkflowRun.objects.count() == len(pushes)


def test_a_run_can_get_the_whole_delivery_as_input(source: str, payloads: PayloadSet) -> None:
    release = payloads.one("github/release/published.json")
    response = _post(Client(), release.body, release.headers)
    assert response.status_code == 202
    run = WorkflowRun.objects.get(pk=response.json()["run_id"])
    assert run.input == {
        "source": SOURCE,
        "provider": "github",
        "event": "release",
        "action": "published",
        "delivery_id": release.delivery_id,
        "payload": release.payload,
    }


def test_an_event_without_handler_is_recorded_and_starts_nothing(
    source: str, payload_set: PayloadSet, settings: Any
) -> None:
    _use_secret_of(payload_set, settings)
    pings = payload_set.github("ping")
    assert len(pings) >= 3
    for ping in pings:
        response = _post(Client(), ping.body, ping.headers)
        assert response.status_code == 202, (ping.name, response.content)
        assert response.json()["run_id"] is None
    assert TriggerEvent.objects.filter(event="ping", run__isnull=True).count() == len(pings)
    assert WorkflowRun.objects.count() == 0


def test_a_function_handler_gets_the_delivery(source: str, payloads: PayloadSet) -> None:
    opened = payloads.one("github/issues/opened.json")
    response = _post(Client(), opened.body, opened.headers)
    assert response.status_code == 202
    assert [call.delivery_id for call in _function_calls] == [opened.delivery_id]
    assert _function_calls[0].action == opened.action == opened.payload["action"] == "opened"
    assert _function_calls[0].payload == opened.payload
    assert TriggerEvent.objects.get().run_id is None


def test_githubs_form_content_type_is_accepted(source: str) -> None:
    from urllib.parse import urlencode

    raw, _ = _example()
    body = urlencode({"payload": raw.decode()}).encode()
    headers = {**_signed(body), "Content-Type": "application/x-www-form-urlencoded"}
    response = _post(Client(), body, headers)
    assert response.status_code == 202, response.content
    assert TriggerEvent.objects.get().payload == json.loads(raw)


def test_a_repeated_delivery_is_not_processed_again(source: str) -> None:
    body, headers = _example()
    first = _post(Client(), body, headers)
    second = _post(Client(), body, headers)
    assert first.status_code == 202
    assert second.status_code == 200
    assert second.json()["status"] == "duplicate"
    assert second.json()["run_id"] == first.json()["run_id"]
    assert TriggerEvent.objects.count() == 1
    assert WorkflowRun.objects.count() == 1


def test_a_body_over_djangos_upload_limit_but_under_ours_is_accepted(
    source: str, settings: Any
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    body, headers = _example()
    assert len(body) > 100
    assert _post(Client(), body, headers).status_code == 202


@pytest.mark.parametrize(
    ("append_slash", "debug"),
    [(True, False), (True, True), (False, False)],
    ids=["append-slash", "append-slash-debug", "no-append-slash"],
)
def test_the_address_without_the_slash_receives_alike(
    source: str, settings: Any, append_slash: bool, debug: bool
) -> None:
    # No redirect: a webhook sender does not follow one (and a 301 turns a POST into a GET);
    # under DEBUG, CommonMiddleware raises for a POST it would redirect.
    settings.APPEND_SLASH = append_slash
    settings.DEBUG = debug
    body, headers = _example()
    client = Client()
    first = _post(client, body, headers, url=URL.rstrip("/"))
    assert first.status_code == 202, (first.status_code, first.get("Location"))
    assert _post(client, body, headers, url=URL.rstrip("/")).status_code == 200
    assert _post(client, body, headers, url=URL).status_code == 200  # the same delivery
    unknown = _post(client, body, headers, url="/hooks/no-such-source")
    assert (unknown.status_code, "error" in unknown.json()) == (404, True)
    assert client.get(URL.rstrip("/")).status_code == 405
    tampered = {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}
    assert _post(client, body, tampered, url=URL.rstrip("/")).status_code == 401
    assert TriggerEvent.objects.count() == 1
    assert WorkflowRun.objects.count() == 1


def test_the_registered_address_keeps_its_slash() -> None:
    from django.urls import reverse

    assert reverse("django_leases:receive-webhook", args=[SOURCE]) == URL


# -- refused deliveries: nothing recorded --------------------------------------------------------


def test_unknown_source_is_404(source: str) -> None:
    body, headers = _example()
    response = _post(Client(), body, headers, url="/hooks/no-such-source/")
    assert response.status_code == 404
    assert "error" in response.json()
    _nothing_recorded()


def test_disabled_source_is_404_at_once(source: str) -> None:
    TriggerSource.objects.set_enabled(SOURCE, False)
    body, headers = _example()
    assert _post(Client(), body, headers).status_code == 404
    _nothing_recorded()
    TriggerSource.objects.set_enabled(SOURCE, True)
    assert _post(Client(), body, headers).status_code == 202


def test_orphaned_source_is_404_even_when_enabled(source: str) -> None:
    TriggerSource.objects.sync([])  # the declaration left the code (as far as the rows know)
    assert TriggerSource.objects.get(name=SOURCE).enabled is True
    body, headers = _example()
    assert _post(Client(), body, headers).status_code == 404
    _nothing_recorded()


def test_a_row_without_declaration_in_this_process_is_503(source: str) -> None:
    """Enabled, but this process has no declaration (a web process of the previous deploy):
    refused as not declared here, 503 so the sender delivers again; nothing recorded."""
    registry.unregister(SOURCE)
    body, headers = _example()
    response = _post(Client(), body, headers)
    assert response.status_code == 503
    assert "not declared in this process" in response.json()["error"]
    _nothing_recorded()


def test_other_methods_are_405_with_a_json_answer(source: str) -> None:
    client = Client()
    for response in (client.get(URL), client.put(URL, data=b"{}"), client.delete(URL)):
        assert response.status_code == 405
        assert response["Content-Type"] == "application/json"
        assert response["Allow"] == "POST"
        assert "not allowed" in response.json()["error"]
    assert client.get("/hooks/no-such-source/").json()["error"]
    _nothing_recorded()


def test_over_the_limit_is_413(source: str, settings: Any) -> None:
    body, headers = _example()
    settings.DJANGO_LEASES = {
        "WEBHOOK_SECRETS": {SOURCE: SECRET},
        "WEBHOOK_MAX_BODY": len(body) - 1,
    }
    assert _post(Client(), body, headers).status_code == 413
    _nothing_recorded()
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}, "WEBHOOK_MAX_BODY": len(body)}
    assert _post(Client(), body, headers).status_code == 202


def test_the_bytes_sent_count_not_only_content_length(source: str, settings: Any) -> None:
    # A sender that gives no Content-Length (or an ASGI server passing the whole stream):
    # the body actually read is measured.
    body, headers = _example()
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}, "WEBHOOK_MAX_BODY": 1000}
    request = RequestFactory().post(
        URL, data=b"", content_type="application/json", headers=_strip_ct(headers)
    )
    request.META.pop("CONTENT_LENGTH", None)
    request._stream = io.BytesIO(body)  # type: ignore[attr-defined]
    response = receive_webhook(request, SOURCE)
    assert response.status_code == 413
    _nothing_recorded()


def test_a_lying_content_length_is_measured_too(source: str, settings: Any) -> None:
    body, headers = _example()
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}, "WEBHOOK_MAX_BODY": 1000}
    request = RequestFactory().post(
        URL, data=b"", content_type="application/json", headers=_strip_ct(headers)
    )
    request.META["CONTENT_LENGTH"] = "10"
    request._stream = io.BytesIO(body)  # type: ignore[attr-defined]
    assert receive_webhook(request, SOURCE).status_code == 413
    _nothing_recorded()


def _strip_ct(headers: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in headers.items() if key != "Content-Type"}


@pytest.mark.parametrize("length", ["abc", "-5"])
def test_a_bad_content_length_is_400(source: str, length: str) -> None:
    request = RequestFactory().post(URL, data=b"{}", content_type="application/json")
    request.META["CONTENT_LENGTH"] = length
    assert receive_webhook(request, SOURCE).status_code == 400
    _nothing_recorded()


@pytest.mark.parametrize(
    "written",
    ["+{n}", " {n}", "{n} ", "\t{n}", "{n}\x0b", "0x{x}", "{n}.0", "{n},{n}", "{u}", "{s}"],
    ids=[
        "plus",
        "space-before",
        "space-after",
        "tab",
        "vertical-tab",
        "hex",
        "decimal-point",
        "two-headers",
        "underscore",
        "other-digits",
    ],
)
def test_a_content_length_that_is_not_plain_digits_is_400(source: str, written: str) -> None:
    # Each of these is the right length of a rightly signed delivery, written the way int()
    # (or a lenient server) would still read.
    body, headers = _example()
    n = len(body)
    length = written.format(
        n=n,
        x=f"{n:x}",
        u=f"{str(n)[:1]}_{str(n)[1:]}",
        s=str(n).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
    )
    response = _post(Client(), body, headers, CONTENT_LENGTH=length)
    assert response.status_code == 400, (length, response.content)
    assert "Content-Length" in response.json()["error"]
    _nothing_recorded()
    assert _post(Client(), body, headers, CONTENT_LENGTH=f"000{n}").status_code == 202


def test_a_content_length_of_thousands_of_digits_is_413(source: str) -> None:
    body, headers = _example()
    response = _post(Client(), body, headers, CONTENT_LENGTH="9" * 5000)
    assert response.status_code == 413
    _nothing_recorded()


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "",
        "sha256=" + "0" * 64,
        "sha1=0123456789abcdef0123456789abcdef01234567",
        "garbage",
    ],
)
def test_missing_or_bad_signature_is_401(source: str, signature: str | None) -> None:
    body, headers = _example()
    headers.pop("X-Hub-Signature-256")
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    response = _post(Client(), body, headers)
    assert response.status_code == 401
    assert "secret" not in response.content.decode().lower().replace("signature", "")
    _nothing_recorded()


@pytest.mark.parametrize(
    "around",
    [("", "\x0b"), ("\x0b", ""), ("", "\x0c"), ("\xa0", "")],
    ids=["trailing-vertical-tab", "leading-vertical-tab", "trailing-form-feed", "no-break-space"],
)
def test_a_right_signature_with_a_character_around_it_is_401(
    source: str, around: tuple[str, str]
) -> None:
    # The test client hands the value to the view as written (a server may strip some).
    body, headers = _example()
    before, after = around
    headers["X-Hub-Signature-256"] = before + headers["X-Hub-Signature-256"] + after
    assert _post(Client(), body, headers).status_code == 401
    _nothing_recorded()
    headers["X-Hub-Signature-256"] = " " + headers["X-Hub-Signature-256"].strip("\x0b\x0c\xa0")
    assert _post(Client(), body, headers).status_code == 202


def test_a_tampered_body_or_another_secret_is_401(source: str) -> None:
    body, headers = _example()
    tampered = body.replace(b'"mara-quill"', b'"mallory"')
    assert tampered != body
    assert _post(Client(), tampered, headers).status_code == 401
    other = {**headers, "X-Hub-Signature-256": github_signature("other-secret", body)}
    assert _post(Client(), body, other).status_code == 401
    _nothing_recorded()


def test_no_configured_secret_is_401(source: str, settings: Any) -> None:
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {}}
    body, headers = _example()
    assert _post(Client(), body, headers).status_code == 401
    _nothing_recorded()


@pytest.mark.parametrize(
    "body",
    [
        b"not json at all",
        b"[1, 2, 3]",
        b'{"ref": NaN}',
        b'{"ref": "refs/heads/\\u0000main"}',
        b'{"ref": "\\udc00"}',
        b'{"n": 1e400}',
        b"\xff\xfe\x00",
        b"",
        b'{"a": ' * 3000 + b"1" + b"}" * 3000,
    ],
)
def test_signed_but_malformed_body_is_400(source: str, body: bytes) -> None:
    response = _post(Client(), body, _signed(body))
    assert response.status_code == 400, response.content
    _nothing_recorded()


@pytest.mark.parametrize("header", ["X-GitHub-Event", "X-GitHub-Delivery"])
def test_signed_but_missing_header_is_400(source: str, header: str) -> None:
    body, headers = _example()
    headers.pop(header)
    response = _post(Client(), body, headers)
    assert response.status_code == 400
    assert header in response.json()["error"]
    _nothing_recorded()


# -- a header sent twice ------------------------------------------------------------------------
#
# WSGI servers and Django's ASGI handler join a repeated header into one value with ",". The
# test client sends that joined value as such; the live server gets two header lines.

_SINGLE_VALUED = ["X-GitHub-Delivery", "X-GitHub-Event", "X-Hub-Signature-256"]


@pytest.mark.parametrize("header", [*_SINGLE_VALUED, "Content-Type"])
def test_a_single_valued_header_holding_a_comma_is_400(source: str, header: str) -> None:
    body, headers = _example()
    headers[header] = f"{headers[header]},{headers[header]}"
    response = _post(Client(), body, headers)
    assert response.status_code == 400, response.content
    assert header in response.json()["error"]
    _nothing_recorded()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("header", _SINGLE_VALUED)
def test_a_header_sent_twice_over_http_is_400(source: str, live_server: Any, header: str) -> None:
    # (Content-Type cannot be tried so: wsgiref keeps the first one and drops the other.)
    body, headers = _example()
    again = str(uuid.uuid4()) if header == "X-GitHub-Delivery" else headers[header]
    answer = raw_request(live_server.url, "POST", URL, [*headers.items(), (header, again)], body)
    assert answer.status == 400, answer
    assert header in json.loads(answer.body)["error"]
    _nothing_recorded()
    assert raw_request(live_server.url, "POST", URL, list(headers.items()), body).status == 202


@pytest.mark.parametrize("header", ["X-GitHub-Event", "X-GitHub-Delivery"])
@pytest.mark.parametrize("around", [("", "\x0b"), ("\x0c", ""), ("", "\xa0")])
def test_an_event_or_delivery_id_with_a_character_around_it_is_400(
    source: str, header: str, around: tuple[str, str]
) -> None:
    body, headers = _example()
    value = headers[header]
    headers[header] = around[0] + value + around[1]
    response = _post(Client(), body, headers)
    assert response.status_code == 400, response.content
    assert header in response.json()["error"]
    _nothing_recorded()
    headers[header] = f" {value}\t"  # HTTP's own whitespace around it is taken off
    assert _post(Client(), body, headers).status_code == 202


def _asgi_request(headers: list[tuple[str, str]], body: bytes) -> Any:
    """The request Django's ASGI handler makes of these header lines (names may repeat)."""
    from django.core.handlers.asgi import ASGIRequest

    scope = {
        "type": "http",
        "method": "POST",
        "path": URL,
        "query_string": b"",
        "headers": [(name.lower().encode(), value.encode("latin-1")) for name, value in headers],
    }
    return ASGIRequest(scope, io.BytesIO(body))


@pytest.mark.parametrize(
    ("header", "again"), [("X-GitHub-Delivery", "other"), ("Content-Length", "")]
)
def test_a_header_sent_twice_through_asgi_is_400(source: str, header: str, again: str) -> None:
    # Django's ASGI handler joins repeated header lines with "," as WSGI servers do.
    body, headers = _example()
    lines = [*headers.items(), ("Content-Length", str(len(body)))]
    lines.append((header, again or str(len(body))))
    request = _asgi_request(lines, body)
    response = receive_webhook(request, SOURCE)
    assert response.status_code == 400, response.content
    assert header in json.loads(response.content)["error"]
    _nothing_recorded()
    assert receive_webhook(_asgi_request(lines[:-1], body), SOURCE).status_code == 202


# -- one transaction ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_failure_while_starting_the_run_leaves_nothing(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_leases.workflows import engine

    real_start = engine.start_workflow

    def start_then_fail(name: str, input: Any = None, *, using: str | None = None) -> Any:
        real_start(name, input, using=using)  # the run row is written…
        raise RuntimeError("the database went away")  # …and then starting fails

    monkeypatch.setattr(engine, "start_workflow", start_then_fail)
    body, headers = _example()
    response = _post(Client(), body, headers)
    assert response.status_code == 500
    assert "nothing was kept" in response.json()["error"]
    _nothing_recorded()

    # The sender delivers again once the fault is gone: it is accepted, not a duplicate.
    monkeypatch.setattr(engine, "start_workflow", real_start)
    response = _post(Client(), body, headers)
    assert response.status_code == 202
    assert TriggerEvent.objects.get().run_id == WorkflowRun.objects.get().pk


@pytest.mark.django_db(transaction=True)
def test_a_workflow_missing_from_the_code_leaves_nothing(settings: Any) -> None:
    webhook_source("test-missing-wf", provider="github", events={"push": StartWorkflow("nope")})
    try:
        settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {"test-missing-wf": SECRET}}
        TriggerSource.objects.sync(registry.declarations())
        TriggerSource.objects.set_enabled("test-missing-wf", True)
        body, headers = _example()
        response = _post(Client(), body, headers, url="/hooks/test-missing-wf/")
        assert response.status_code == 500
        _nothing_recorded()
    finally:
        registry.unregister("test-missing-wf")


@pytest.mark.django_db(transaction=True)
def test_simultaneous_copies_of_one_delivery_start_one_run(source: str) -> None:
    body, headers = _example()
    rounds = 3 if connection.vendor == "sqlite" else 10
    copies = 8
    for round_number in range(rounds):
        delivery_headers = {**headers, "X-GitHub-Delivery": f"race-{round_number}"}

        def deliver(delivery_headers: dict[str, str] = delivery_headers) -> int:
            return _post(Client(), body, delivery_headers).status_code

        statuses = race([deliver] * copies)
        assert sorted(statuses) == [200] * (copies - 1) + [202], statuses
    assert TriggerEvent.objects.count() == rounds
    assert WorkflowRun.objects.count() == rounds


# -- a source switched off while a delivery is arriving --------------------------------------------


def _after_the_early_check(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once ``receive`` has found the source receivable, before the body is read."""
    from django_leases.triggers import receiving

    checked = threading.Event()
    real_max_body = receiving.max_body

    def max_body() -> int:
        checked.set()
        return real_max_body()

    monkeypatch.setattr(receiving, "max_body", max_body)
    return checked


def _http_answer(sock: Any) -> tuple[int, dict[str, Any]]:
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


@pytest.mark.django_db(transaction=True)
def test_a_source_disabled_while_the_body_arrives_is_404(
    source: str, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over a real socket: the headers and the first bytes of the body are sent, the source is
    # switched off (committed) once the receiver has looked it up, then the rest is sent.
    import socket
    from urllib.parse import urlsplit

    checked = _after_the_early_check(monkeypatch)
    body, headers = _example()
    address = urlsplit(live_server.url)
    head = "".join(
        [
            f"POST {URL} HTTP/1.1\r\n",
            f"Host: {address.netloc}\r\n",
            f"Content-Length: {len(body)}\r\n",
            "Connection: close\r\n",
            *(f"{key}: {value}\r\n" for key, value in headers.items()),
            "\r\n",
        ]
    ).encode()
    with socket.create_connection((address.hostname, address.port), timeout=60) as sock:
        sock.sendall(head + body[:10])
        assert checked.wait(timeout=60), "the receiver never looked the source up"
        assert TriggerSource.objects.set_enabled(SOURCE, False) is True
        sock.sendall(body[10:])
        status, answer = _http_answer(sock)
    assert status == 404, answer
    assert "error" in answer
    _nothing_recorded()


@pytest.mark.django_db(transaction=True)
def test_a_source_orphaned_while_the_body_arrives_is_404(source: str) -> None:
    body, headers = _example()

    class ArrivingBody(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            # By the time the body is read the source was found receivable; now another
            # process syncs code where its declaration is gone.
            on_another_thread(lambda: TriggerSource.objects.sync([]))
            return super().read(size)

    request = RequestFactory().post(
        URL, data=body, content_type="application/json", headers=_strip_ct(headers)
    )
    request._stream = ArrivingBody(body)  # type: ignore[attr-defined]
    response = receive_webhook(request, SOURCE)
    assert response.status_code == 404, response.content
    assert TriggerSource.objects.get(name=SOURCE).declared is False
    _nothing_recorded()


@pytest.mark.django_db(transaction=True)
def test_a_repeated_delivery_to_a_source_disabled_meanwhile_is_404(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, headers = _example()
    assert _post(Client(), body, headers).status_code == 202
    checked = _after_the_early_check(monkeypatch)

    def disable_once_checked(size: int) -> bytes:
        assert checked.is_set()
        assert on_another_thread(lambda: TriggerSource.objects.set_enabled(SOURCE, False))
        return body

    request = RequestFactory().post(
        URL, data=body, content_type="application/json", headers=_strip_ct(headers)
    )
    request.read = disable_once_checked  # type: ignore[method-assign]
    assert receive_webhook(request, SOURCE).status_code == 404
    assert TriggerEvent.objects.count() == 1
    assert WorkflowRun.objects.count() == 1


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_disabling_waits_for_a_delivery_being_recorded(settings: Any) -> None:
    # The other half of the rule: a delivery already being recorded (its handler running)
    # commits first; set_enabled(False) waits for it on the source row's lock and returns
    # after it. SQLite gets the same order from its IMMEDIATE write lock.
    name = "test-waits"
    state: dict[str, Any] = {}

    def handler(delivery: Delivery) -> None:
        # Seen blocked by this (the recording) transaction's backend: pg_blocking_pids().
        state["disable"] = start_blocked(lambda: TriggerSource.objects.set_enabled(name, False))

    webhook_source(name, provider="github", events={"issues": handler})
    try:
        settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {name: SECRET}}
        TriggerSource.objects.sync(registry.declarations())
        TriggerSource.objects.set_enabled(name, True)
        body, headers = _example("issues/opened")
        response = _post(Client(), body, headers, url=f"/hooks/{name}/")
        changed = state["disable"].result()
        assert state["disable"].waited, "set_enabled did not wait for the delivery"
        assert response.status_code == 202, response.content
        assert changed is True
        assert TriggerEvent.objects.filter(source_name=name).count() == 1
        assert TriggerSource.objects.get(name=name).enabled is False
        again = {**headers, "X-GitHub-Delivery": str(uuid.uuid4())}
        assert _post(Client(), body, again, url=f"/hooks/{name}/").status_code == 404
    finally:
        registry.unregister(name)


# -- the demo's own source ----------------------------------------------------------------------


def test_the_demo_source_starts_build_preview(db: None) -> None:
    from django.conf import settings as django_settings

    from django_leases.workflows.registry import get_workflow

    get_workflow("build-preview")  # the demo's workflows.py is loaded
    secret = django_settings.DJANGO_LEASES["WEBHOOK_SECRETS"]["github-pushes"]
    TriggerSource.objects.sync(registry.declarations())
    url = "/hooks/github-pushes/"
    body, headers = _example()
    headers["X-Hub-Signature-256"] = github_signature(secret, body)
    assert _post(Client(), body, headers, url=url).status_code == 404  # off until enabled
    TriggerSource.objects.set_enabled("github-pushes", True)
    response = _post(Client(), body, headers, url=url)
    assert response.status_code == 202, response.content
    run = WorkflowRun.objects.get(pk=response.json()["run_id"])
    assert (run.workflow, run.input) == ("build-preview", json.loads(body))


# -- the signing secret from the credential store ----------------------------------------------


def test_a_secret_from_the_credential_store_verifies(source: str, settings: Any) -> None:
    settings.DJANGO_LEASES = {}
    set_secret(SOURCE, SECRET)
    body, headers = _example()
    assert _post(Client(), body, headers).status_code == 202


def test_the_settings_secret_wins_over_the_stored_one(source: str) -> None:
    set_secret(SOURCE, "stored-but-overridden")
    body, headers = _example()  # signed with SECRET, the settings' one
    assert _post(Client(), body, headers).status_code == 202
    stored_signed = {**headers, "X-GitHub-Delivery": str(uuid.uuid4())}
    stored_signed["X-Hub-Signature-256"] = github_signature("stored-but-overridden", body)
    assert _post(Client(), body, stored_signed).status_code == 401


def test_an_undecryptable_stored_secret_is_401_not_500(
    source: str, settings: Any, caplog: Any
) -> None:
    settings.DJANGO_LEASES = {"SECRET_KEYS": [Fernet.generate_key().decode()]}
    set_secret(SOURCE, SECRET)
    settings.DJANGO_LEASES = {"SECRET_KEYS": [Fernet.generate_key().decode()]}
    body, headers = _example()
    assert _post(Client(), body, headers).status_code == 401
    assert "cannot be decrypted" in caplog.text
    _nothing_recorded()


# -- Stripe, and manual sources signed Stripe's way ------------------------------------------------

STRIPE_SOURCE = "test-payments"
MANUAL_SOURCE = "test-manual-stripe"
STRIPE_SECRET = ours().stripe_secret  # our Stripe deliveries are signed with it
STRIPE_T = ours().stripe_time  # the t of their signatures


@contextmanager
def _stripe_sources_for(payloads: PayloadSet, settings: Any) -> Iterator[None]:
    """A ``stripe`` and a ``manual`` (signed Stripe's way) source with the secret ``payloads``
    are signed with, the clock just after they were signed."""
    settings.DJANGO_LEASES = {}
    webhook_source(
        STRIPE_SOURCE,
        provider="stripe",
        events={"invoice.paid": StartWorkflow(WORKFLOW), "charge.succeeded": _on_issue},
    )
    webhook_source(
        MANUAL_SOURCE,
        provider="manual",
        config={"signature": "stripe"},
        events={"customer.created": StartWorkflow(WORKFLOW, input="delivery")},
    )
    try:
        TriggerSource.objects.sync(registry.declarations())
        for name in (STRIPE_SOURCE, MANUAL_SOURCE):
            TriggerSource.objects.set_enabled(name, True)
            set_secret(name, payloads.stripe_secret)
        _function_calls.clear()
        with time_machine.travel(payloads.stripe_time + 30, tick=False):
            yield
    finally:
        registry.unregister(STRIPE_SOURCE)
        registry.unregister(MANUAL_SOURCE)


@pytest.fixture
def stripe_sources(db: None, settings: Any, payloads: PayloadSet) -> Iterator[None]:
    with _stripe_sources_for(payloads, settings):
        yield


def _stripe_example(type_: str) -> tuple[bytes, dict[str, str]]:
    """Our Stripe delivery of event type ``type_``: body, headers."""
    sample = ours().stripe_event(type_)
    return sample.body, sample.header_copy()


def test_every_stripe_event_is_accepted(db: None, settings: Any, payload_set: PayloadSet) -> None:
    client = Client()
    events = payload_set.stripe()
    assert {e.event for e in events} == {
        "charge.succeeded",
        "checkout.session.completed",
        "customer.created",
        "invoice.paid",
        "payment_intent.succeeded",
    }
    with _stripe_sources_for(payload_set, settings):
        for sample in events:
            response = _post(client, sample.body, sample.headers, url=f"/hooks/{STRIPE_SOURCE}/")
            assert response.status_code == 202, (sample.name, response.content)
            event = TriggerEvent.objects.get(
                source_name=STRIPE_SOURCE, delivery_id=sample.payload["id"]
            )
            assert event.event == sample.event
            assert event.payload == sample.payload
        paid = TriggerEvent.objects.get(source_name=STRIPE_SOURCE, event="invoice.paid")
        assert paid.run is not None
        assert paid.run.input == payload_set.stripe_event("invoice.paid").payload
        assert [d.event for d in _function_calls] == ["charge.succeeded"]
        assert WorkflowRun.objects.count() == 1


def test_a_repeated_stripe_event_is_not_processed_again(stripe_sources: None) -> None:
    body, headers = _stripe_example("invoice.paid")
    url = f"/hooks/{STRIPE_SOURCE}/"
    assert _post(Client(), body, headers, url=url).status_code == 202
    again = _post(Client(), body, headers, url=url)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert WorkflowRun.objects.count() == 1


def test_a_stale_stripe_signature_is_a_refused_replay(stripe_sources: None) -> None:
    body, headers = _stripe_example("invoice.paid")
    with time_machine.travel(STRIPE_T + 301, tick=False):
        response = _post(Client(), body, headers, url=f"/hooks/{STRIPE_SOURCE}/")
    assert response.status_code == 401
    _nothing_recorded()


@pytest.mark.parametrize(
    "signature",
    [None, "", f"t={STRIPE_T}", f"t={STRIPE_T},v0={'0' * 64}", f"t={STRIPE_T},v1={'0' * 64}"],
)
def test_a_missing_or_bad_stripe_signature_is_401(
    stripe_sources: None, signature: str | None
) -> None:
    body, headers = _stripe_example("invoice.paid")
    headers.pop("Stripe-Signature")
    if signature is not None:
        headers["Stripe-Signature"] = signature
    assert _post(Client(), body, headers, url=f"/hooks/{STRIPE_SOURCE}/").status_code == 401
    _nothing_recorded()


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda signed: signed + "\x0b",
        lambda signed: "\x0b" + signed,
        lambda signed: signed + "\x0c",
        lambda signed: signed.replace(",v1=", ", v1="),
    ],
    ids=["trailing-vertical-tab", "leading-vertical-tab", "trailing-form-feed", "inner-space"],
)
def test_a_right_stripe_signature_written_otherwise_is_401(
    stripe_sources: None, rewrite: Any
) -> None:
    body, headers = _stripe_example("invoice.paid")
    signed = headers["Stripe-Signature"]
    url = f"/hooks/{STRIPE_SOURCE}/"
    headers["Stripe-Signature"] = rewrite(signed)
    assert _post(Client(), body, headers, url=url).status_code == 401
    _nothing_recorded()
    headers["Stripe-Signature"] = f" {signed}\t"  # HTTP's own whitespace around it is fine
    assert _post(Client(), body, headers, url=url).status_code == 202


@pytest.mark.parametrize(
    "body", [b'{"type": "invoice.paid"}', b'{"id": "evt_1"}', b"[]", b"nope", b""]
)
def test_a_signed_but_malformed_stripe_body_is_400(stripe_sources: None, body: bytes) -> None:
    headers = {"Stripe-Signature": stripe_signature(STRIPE_SECRET, body, STRIPE_T)}
    assert _post(Client(), body, headers, url=f"/hooks/{STRIPE_SOURCE}/").status_code == 400
    _nothing_recorded()


def test_a_stripe_signature_joined_with_another_is_400(stripe_sources: None) -> None:
    body, headers = _stripe_example("invoice.paid")
    signed = headers["Stripe-Signature"]
    headers["Stripe-Signature"] = f"{signed},{signed}"
    response = _post(Client(), body, headers, url=f"/hooks/{STRIPE_SOURCE}/")
    assert response.status_code == 400
    assert "Stripe-Signature" in response.json()["error"]
    _nothing_recorded()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", [STRIPE_SOURCE, MANUAL_SOURCE])
def test_a_stripe_signature_sent_twice_over_http_is_400(
    stripe_sources: None, live_server: Any, name: str
) -> None:
    body, headers = _stripe_example("customer.created")
    twice = [*headers.items(), ("Stripe-Signature", headers["Stripe-Signature"])]
    answer = raw_request(live_server.url, "POST", f"/hooks/{name}/", twice, body)
    assert answer.status == 400, answer
    _nothing_recorded()
    once = list(headers.items())
    assert raw_request(live_server.url, "POST", f"/hooks/{name}/", once, body).status == 202


def test_a_manual_source_signed_stripes_way(stripe_sources: None) -> None:
    body, headers = _stripe_example("customer.created")
    response = _post(Client(), body, headers, url=f"/hooks/{MANUAL_SOURCE}/")
    assert response.status_code == 202, response.content
    run = WorkflowRun.objects.get()
    assert run.input["provider"] == "manual"
    assert run.input["event"] == "customer.created"
    github_signed = {"X-Hub-Signature-256": github_signature(STRIPE_SECRET, body)}
    assert _post(Client(), body, github_signed, url=f"/hooks/{MANUAL_SOURCE}/").status_code == 401


def test_a_disabled_stripe_source_is_404(stripe_sources: None) -> None:
    TriggerSource.objects.set_enabled(STRIPE_SOURCE, False)
    body, headers = _stripe_example("invoice.paid")
    assert _post(Client(), body, headers, url=f"/hooks/{STRIPE_SOURCE}/").status_code == 404
    _nothing_recorded()


def test_the_secret_never_reaches_logs_or_answers(stripe_sources: None, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    body, headers = _stripe_example("invoice.paid")
    url = f"/hooks/{STRIPE_SOURCE}/"
    answers = [
        _post(Client(), body, headers, url=url),
        _post(Client(), body, headers, url=url),
        _post(Client(), body, {"Stripe-Signature": "t=1,v1=00"}, url=url),
        _post(
            Client(),
            b"[]",
            {"Stripe-Signature": stripe_signature(STRIPE_SECRET, b"[]", STRIPE_T)},
            url=url,
        ),
    ]
    assert [a.status_code for a in answers] == [202, 200, 401, 400]
    for answer in answers:
        assert STRIPE_SECRET not in answer.content.decode()
    assert STRIPE_SECRET not in caplog.text


def _nested_payload_test(ci: str) -> subprocess.CompletedProcess[str]:
    """Run one test over every payload set in a clone without ``../shared`` (on SQLite: the
    nested suite must not drop this one's test database)."""
    env = {
        **os.environ,
        "DJANGO_LEASES_SHARED_DIR": "/nonexistent-shared",
        "CI": ci,
        "DATABASE_URL": "",
    }
    env.pop("PYTEST_ADDOPTS", None)
    argv = [sys.executable, "-m", "pytest", __file__, "-p", "no:cacheprovider", "-rs"]
    return subprocess.run(
        [*argv, "-k", "test_every_push_starts_one_run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.timeout(600)
def test_a_clone_without_the_shared_fixtures_skips_nothing_for_them() -> None:
    done = _nested_payload_test("false")
    assert done.returncode == 0, done.stdout[-800:]
    assert "skipped" not in done.stdout and "not present" not in done.stdout, done.stdout[-800:]
    assert "extra run is not collected" in done.stdout, done.stdout[-800:]
    required = _nested_payload_test("true")  # under CI the extra run is required: it fails
    assert required.returncode == 1, required.stdout[-800:]
    assert "/nonexistent-shared/fixtures is missing" in required.stdout, required.stdout[-800:]


@pytest.mark.parametrize(
    "ref", [pytest.param("refs/heads/" + "b" * 300, id="too-long"), pytest.param(17, id="a-number")]
)
def test_a_key_no_run_can_have_is_recorded_not_a_500(source: str, ref: Any) -> None:
    """The key callable returns what the payload holds — here a ref longer than any run key
    (255 characters), or a number: the delivery is recorded (202), its outcome saying no run
    started; a 500 would have GitHub redeliver it for ever."""
    body = json.dumps({"ref": ref}).encode()
    response = _post(Client(), body, _signed(body, event="create"))
    assert response.status_code == 202, (response.status_code, response.content)
    (event,) = TriggerEvent.objects.filter(source_name=SOURCE)
    assert event.run_id is None and "not started" in event.outcome, event.outcome
    assert not WorkflowRun.objects.filter(workflow=WORKFLOW).exists()
