"""Test your webhook handlers inside Django's ``TestCase``: :func:`enable_source`, :func:`deliver`.

Enabling a source for real (the admin, ``trigger_sources enable``,
:func:`django_leases.triggers.lifecycle.enable`) takes the source's lease, which must be
committed to protect anything, and calls the provider's API; neither belongs in a
``TestCase``, whose test runs in one transaction that is rolled back. A test of *what your
handler does with a delivery* needs neither: :func:`enable_source` turns the source on in
the test's transaction, with a signing secret and no provider call, and :func:`deliver`
posts a delivery signed the way the source's provider signs (GitHub, Stripe, or a
``manual`` source's ``config["signature"]`` scheme) through Django's test client, to the
real receive view. ::

    from django.test import TestCase

    from django_leases.testing import deliver, drive, enable_source


    class PullRequestHookTests(TestCase):
        def test_an_opened_pull_request_starts_a_review(self):
            enable_source("github-prs")
            response = deliver("github-prs", "pull_request", {"action": "opened", "number": 22})
            self.assertEqual(response.status_code, 202)
            run = drive(response.json()["run_id"])
            self.assertEqual(run.status, "running")

To test the lifecycle itself (setup and teardown at a provider), use a
``TransactionTestCase`` and the fake provider of :mod:`django_leases.testing.providers`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import router
from django.test import Client
from django.urls import reverse

from django_leases.conf import leases_settings
from django_leases.models.trigger import TriggerSecret, TriggerSource
from django_leases.triggers.registry import declarations, get_declaration
from django_leases.triggers.signatures import (
    GITHUB_SIGNATURE_HEADER,
    STRIPE_SIGNATURE_HEADER,
    github_signature,
    stripe_signature,
)

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse

    from django_leases.triggers.registry import TriggerDeclaration

#: The signing secret :func:`enable_source` stores when given none (a test's own).
TEST_SECRET = "django-leases-test-signing-secret"


def _declared(name: str) -> TriggerDeclaration:
    declaration = get_declaration(name) if isinstance(name, str) else None
    if declaration is None:
        raise ValueError(
            f"No loaded code declares trigger source {name!r} (is the app with its "
            "triggers.py in INSTALLED_APPS?)"
        )
    return declaration


def signature_scheme(name: str) -> str:
    """How deliveries to declared source ``name`` are signed: ``"github"`` or ``"stripe"``
    (a ``manual`` source: its ``config["signature"]``, GitHub's by default).

    Raises ``ValueError`` for a source no loaded code declares, or whose provider signs
    some other way (a provider of your own: sign its deliveries yourself)."""
    declaration = _declared(name)
    if declaration.provider in ("github", "stripe"):
        return declaration.provider
    if declaration.provider == "manual":
        return str(declaration.config.get("signature", "github"))
    raise ValueError(
        f"Trigger source {name!r} uses provider {declaration.provider!r}: deliver() signs "
        "the github, stripe and manual providers' ways only"
    )


def enable_source(name: str, *, secret: str | None = None, using: str | None = None) -> str:
    """Turn declared source ``name`` on for a test, with a signing secret, calling no provider.

    Syncs the declarations into rows (as ``reconcile_trigger_sources`` does, without its
    setups), switches the source on and, unless ``DJANGO_LEASES["WEBHOOK_SECRETS"]`` has
    one for it, stores ``secret`` (default :data:`TEST_SECRET`) in the credential store.
    No lease is taken, so it works inside ``transaction.atomic()`` — a ``TestCase`` — and
    everything it wrote is rolled back with the test.

    Args:
        name: a declared source's name.
        secret: the signing secret to store (``str``); ignored when ``WEBHOOK_SECRETS``
            names the source (that one signs then).
        using: database alias (default: the router's choice for ``TriggerSource``).

    Returns the signing secret deliveries to the source are now verified with.

    Raises:
        ValueError: no loaded code declares ``name``; an empty or control-character
            ``secret`` (nothing written).
    """
    _declared(name)
    alias = using or router.db_for_write(TriggerSource)
    secrets = TriggerSecret.objects.db_manager(alias)
    signing = secrets.signing_secret(name)
    configured = leases_settings.WEBHOOK_SECRETS
    if not (isinstance(configured, Mapping) and configured.get(name)):
        signing = TEST_SECRET if secret is None else secret
        secrets.set_secret(name, signing)
    sources = TriggerSource.objects.db_manager(alias)
    sources.sync(declarations())
    sources.set_enabled(name, True)
    sources.record(name, status="registered", detail="Enabled for a test (no provider call).")
    assert signing is not None
    return signing


def deliver(
    name: str,
    event: str,
    payload: Mapping[str, Any] | None = None,
    *,
    delivery_id: str | None = None,
    secret: str | None = None,
    headers: Mapping[str, str] | None = None,
    client: Client | None = None,
    using: str | None = None,
) -> _MonkeyPatchedWSGIResponse:
    """POST one signed delivery of ``event`` to source ``name``'s receive view, as its
    provider would, through Django's test client; returns the response.

    GitHub style (``github``, and ``manual`` sources by default): the JSON ``payload`` as
    the body, ``X-GitHub-Event: event``, ``X-GitHub-Delivery: delivery_id`` and
    ``X-Hub-Signature-256``. Stripe style (``stripe``, ``manual`` with
    ``config={"signature": "stripe"}``): ``payload`` is the event object, given its ``id``
    (``delivery_id``) and ``type`` (``event``) unless it has them, signed in
    ``Stripe-Signature`` at the current time.

    Args:
        name: a declared source (enabled, e.g. with :func:`enable_source`, for a 202).
        event: the event name (GitHub's ``X-GitHub-Event``, Stripe's ``type``).
        payload: the JSON object the provider sends (default ``{}``).
        delivery_id: the delivery's id (default: a new UUID); the same id twice is a
            repeated delivery (200, processed once).
        secret: sign with this secret instead of the source's (e.g. a wrong one, to see the
            401).
        headers: extra or replacing request headers.
        client: the test client to post with (default: a new ``django.test.Client``).
        using: database alias the source's secret is read from (default: the router's).

    Returns the test client's response: 202 with JSON ``{"event_id", "run_id", …}`` when
    recorded, 200 for a repeated delivery id, 404 / 401 / 400 / 413 / 503 as the receiver
    refuses (see the trigger sources guide, "What a delivery gets").

    Raises:
        ValueError: no loaded code declares ``name``, its provider signs another way, or
            no signing secret is known for it and ``secret`` is not given.
    """
    scheme = signature_scheme(name)
    if secret is None:
        alias = using or router.db_for_read(TriggerSecret)
        secret = TriggerSecret.objects.db_manager(alias).signing_secret(name)
        if not secret:
            raise ValueError(
                f"Trigger source {name!r} has no signing secret: call enable_source({name!r}) "
                "first, or pass secret="
            )
    delivery_id = delivery_id or str(uuid.uuid4())
    sent: dict[str, str]
    if scheme == "stripe":
        body_object = {"id": delivery_id, "type": event, "object": "event", **(payload or {})}
        body = json.dumps(body_object).encode()
        sent = {STRIPE_SIGNATURE_HEADER: stripe_signature(secret, body, int(time.time()))}
    else:
        body = json.dumps(dict(payload or {})).encode()
        sent = {
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery_id,
            GITHUB_SIGNATURE_HEADER: github_signature(secret, body),
        }
    sent.update(headers or {})
    url = reverse("django_leases:receive-webhook", args=[name])
    return (client or Client()).post(url, data=body, content_type="application/json", headers=sent)


__all__ = ["TEST_SECRET", "deliver", "enable_source", "signature_scheme"]
