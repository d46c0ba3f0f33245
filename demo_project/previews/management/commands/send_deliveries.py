"""``manage.py send_deliveries SOURCE [FILE ...]``: sign webhook payloads and POST them, as the
provider would.

The demo's stand-in for GitHub and Stripe sending deliveries. For each payload file it builds
the request the provider sends — signed with the source's signing secret (the credential
store, or ``DJANGO_LEASES["WEBHOOK_SECRETS"]``) the way the source's provider verifies it —
POSTs it to ``<base-url>/hooks/<SOURCE>/`` and prints the answer:

* GitHub (``github``, or ``manual`` with ``config["signature"] == "github"``): the exact file
  bytes, ``X-GitHub-Event`` (``--event``, else the name of the file's folder when the source
  handles that event, e.g. ``push``, else the source's only event), a fresh
  ``X-GitHub-Delivery`` id and ``X-Hub-Signature-256``;
* Stripe (``stripe``, or ``manual`` with ``"signature": "stripe"``): the exact file bytes and
  ``Stripe-Signature: t=<now>,v1=…`` (the event's ``type`` and ``id`` are in the body, so a
  file sent twice is the same delivery and is answered 200 without being processed again).

Without FILEs it sends, for each event the source's declaration handles, the real payloads
under ``../shared/fixtures/`` (``github/<event>/*.json`` or ``stripe/events/<event>.json``)
when that folder exists, else the demo's own samples (:data:`SAMPLES`).

``--base-url`` defaults to the address the source was reconciled with; ``--wrong-secret``
signs with a secret that is not the source's (the answer is 401). ``--expect 202 200``
makes the command exit 1 unless every answer is one of those statuses; ``--json`` prints one
JSON object per delivery (``file``, ``path``, ``event``, ``delivery_id``, ``status``,
``answer``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_leases.triggers.registry import get_declaration
from django_leases.triggers.signatures import github_signature, stripe_signature

DEMO_DIR = Path(__file__).resolve().parents[3]
#: ``../shared/fixtures`` beside the checkout (``DEMO_SHARED_FIXTURES`` names another folder;
#: one that does not exist makes the demo use its own samples).
SHARED_FIXTURES = Path(
    os.environ.get("DEMO_SHARED_FIXTURES") or Path(settings.BASE_DIR).parent / "shared" / "fixtures"
)
#: The demo's own samples, by signature scheme: GitHub pushes at the top of
#: ``previews/samples``, other GitHub events in ``<samples>/<event>/`` folders
#: (``reviews/samples/pull_request/``…), Stripe events as whole files.
SAMPLES = {
    "github": (DEMO_DIR / "previews" / "samples", DEMO_DIR / "reviews" / "samples"),
    "stripe": (DEMO_DIR / "shop" / "samples",),
}


def signature_scheme(provider: str, config: dict[str, Any] | None) -> str:
    """``"github"`` or ``"stripe"``: how deliveries to a source of ``provider`` are signed."""
    if provider == "manual":
        return "stripe" if (config or {}).get("signature") == "stripe" else "github"
    if provider in ("github", "stripe"):
        return provider
    raise CommandError(f"Cannot sign for provider {provider!r}")


def default_payloads(scheme: str, events: list[str]) -> tuple[list[tuple[Path, str]], str]:
    """``([(file, event), …], where)`` for the declared ``events``: the shared fixtures when
    present, else the demo's samples."""
    found: list[tuple[Path, str]] = []
    if SHARED_FIXTURES.is_dir():
        for event in events:
            if scheme == "github":
                found += [
                    (p, event) for p in sorted((SHARED_FIXTURES / "github" / event).glob("*.json"))
                ]
            else:
                path = SHARED_FIXTURES / "stripe" / "events" / f"{event}.json"
                if path.is_file():
                    found.append((path, event))
        if found:
            return found, f"the real payloads in {SHARED_FIXTURES}"
    for folder in SAMPLES[scheme]:
        for path in sorted(folder.glob("*.json")):
            event = "push" if scheme == "github" else _stripe_type(path)
            if event in events:
                found.append((path, event))
        if scheme == "github":
            for event in events:
                found += [(p, event) for p in sorted((folder / event).glob("*.json"))]
    folders = ", ".join(str(folder) for folder in SAMPLES[scheme])
    return found, f"the demo's own samples in {folders}"


def _event_of(path: Path, events: list[str]) -> str:
    """A GitHub payload file's event: its folder's name when the source handles that event,
    else the source's only event."""
    if path.parent.name in events:
        return path.parent.name
    if len(events) == 1:
        return events[0]
    raise CommandError(f"Which event is {path}? Give --event (the source handles {events})")


def _stripe_type(path: Path) -> str:
    try:
        return str(json.loads(path.read_bytes()).get("type"))
    except (ValueError, AttributeError):
        return ""


def signed_request(scheme: str, secret: str, body: bytes, event: str) -> tuple[dict[str, str], str]:
    """The headers a provider sends with ``body``, and the delivery id they carry."""
    if scheme == "github":
        delivery_id = str(uuid.uuid4())
        return {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/demo",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery_id,
            "X-Hub-Signature-256": github_signature(secret, body),
        }, delivery_id
    try:
        delivery_id = str(json.loads(body).get("id"))
    except (ValueError, AttributeError):
        delivery_id = "?"
    return {
        "Content-Type": "application/json; charset=utf-8",
        "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        "Stripe-Signature": stripe_signature(secret, body, int(time.time())),
    }, delivery_id


class Command(BaseCommand):
    help = "Sign webhook payloads with a source's secret and POST them to the demo server."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source", help="The trigger source's name.")
        parser.add_argument(
            "files", nargs="*", type=Path, help="Payload files (default: see --help)."
        )
        parser.add_argument("--base-url", help="The server's address (default: the source's).")
        parser.add_argument("--event", help="The event name (GitHub; default: the file's folder).")
        parser.add_argument(
            "--expect",
            nargs="+",
            type=int,
            metavar="STATUS",
            help="Exit 1 unless every answer is one of these.",
        )
        parser.add_argument("--json", action="store_true", help="One JSON object per delivery.")
        parser.add_argument(
            "--wrong-secret",
            action="store_true",
            help="Sign with a secret that is not the source's (to see the 401).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django_leases.models import TriggerSource
        from django_leases.triggers.credentials import signing_secret

        name = options["source"]
        declaration = get_declaration(name)
        row = TriggerSource.objects.filter(name=name).first()
        if declaration is None and row is None:
            raise CommandError(f"Unknown trigger source {name!r}")
        provider = declaration.provider if declaration is not None else row.provider  # type: ignore[union-attr]
        config = dict(declaration.config) if declaration is not None else dict(row.config or {})  # type: ignore[union-attr]
        scheme = signature_scheme(provider, config)
        secret = signing_secret(name)
        if not secret:
            raise CommandError(f"Source {name!r} has no signing secret yet (enable it first)")
        if options["wrong_secret"]:
            secret = f"not-{secret}"
        base_url = options["base_url"] or (row.base_url if row is not None else None)
        if not base_url:
            raise CommandError("No --base-url given and the source has no address")
        url = f"{base_url.rstrip('/')}/hooks/{name}/"

        events = sorted(declaration.events) if declaration is not None else []
        if options["files"]:
            payloads = [(p, options["event"] or _event_of(p, events)) for p in options["files"]]
        else:
            payloads, where = default_payloads(scheme, events)
            if not options["json"]:
                self.stdout.write(f"Payloads: {where}")
        if not payloads:
            raise CommandError("No payloads to send")

        unexpected = 0
        with httpx.Client(timeout=30) as client:
            for path, event in payloads:
                try:
                    body = path.read_bytes()
                except OSError as exc:
                    raise CommandError(f"Cannot read {path}: {exc}") from None
                if scheme == "stripe":
                    event = _stripe_type(path) or event
                headers, delivery_id = signed_request(scheme, secret, body, event)
                try:
                    response = client.post(url, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    raise CommandError(f"POST {url} failed: {exc}") from None
                try:
                    answer: Any = response.json()
                except ValueError:
                    answer = response.text[:200]
                if options["expect"] and response.status_code not in options["expect"]:
                    unexpected += 1
                shown = str(
                    path.relative_to(SHARED_FIXTURES)
                    if path.is_relative_to(SHARED_FIXTURES)
                    else path.name
                )
                if options["json"]:
                    self.stdout.write(
                        json.dumps(
                            {
                                "file": shown,
                                "path": str(path.resolve()),
                                "event": event,
                                "delivery_id": delivery_id,
                                "status": response.status_code,
                                "answer": answer,
                            }
                        )
                    )
                else:
                    self.stdout.write(f"{shown} ({event}): {response.status_code} {answer}")
        if unexpected:
            raise CommandError(
                f"{unexpected} of {len(payloads)} deliveries got an unexpected status"
            )
