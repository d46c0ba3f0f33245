"""Webhook deliveries for the tests, loaded and signed in one place.

Two payload sets have the same layout (``github/<event>/*.json``, ``stripe/events/<type>.json``):

* ``ours``: ``tests/fixtures/``, written for this suite from GitHub's and Stripe's documented
  formats (see its README). Always there, so every test that needs a delivery can run.
* ``shared``: the real third-party payloads in ``../shared/fixtures/`` beside the checkout
  (``DJANGO_LEASES_SHARED_DIR`` names another folder in place of ``../shared``). A checkout
  without it does not collect the runs over them (nothing is skipped; the pytest header says
  so); under ``CI=true`` they are collected and fail.

A :class:`Sample` is one delivery: the exact file bytes and the headers the provider sends
with them, signed with the set's test secret. For ``ours`` the helper builds and signs the
headers; for ``shared`` they are the example headers of its ``manifest.json`` (signed there,
independently of our signer).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from django_leases.triggers.signatures import github_signature, stripe_signature

OURS_DIR = Path(__file__).resolve().parent / "fixtures"
#: ``../shared`` beside the checkout: the real webhook payloads, when this machine has them.
SHARED_DIR = Path(
    os.environ.get("DJANGO_LEASES_SHARED_DIR")
    or Path(__file__).resolve().parent.parent.parent / "shared"
)

#: The test secrets our own deliveries are signed with.
GITHUB_SECRET = "suite-github-secret"
STRIPE_SECRET = "whsec_suite_stripe_secret"
#: When our Stripe deliveries are signed (``Stripe-Signature: t=…``): 2025-10-22T12:00:00Z,
#: a minute or so after the events were created.
STRIPE_SENT_AT = 1761134400

#: What our GitHub deliveries carry besides the signature.
GITHUB_HOOK_ID = "512870331"
GITHUB_USER_AGENT = "GitHub-Hookshot/7d3e0a1"
#: GitHub events without an ``action`` field; for the others our file is named after it.
ACTIONLESS_EVENTS = frozenset({"push", "ping"})

SET_NAMES = ("ours", "shared")


def shared_required() -> bool:
    """Whether the run over the real payloads must happen: under ``CI=true``."""
    return os.environ.get("CI", "").lower() == "true"


def set_names() -> tuple[str, ...]:
    """The payload sets the tests that take every payload run over: ``ours`` always, and
    ``shared`` where this machine has it or CI requires it (missing there, it fails). A
    clone without ``../shared`` collects no run over it, so nothing is skipped for it."""
    if (SHARED_DIR / "fixtures").is_dir() or shared_required():
        return SET_NAMES
    return ("ours",)


@dataclass(frozen=True)
class Sample:
    """One delivery: a payload file and the headers its provider sends with it."""

    provider: str  # "github" or "stripe"
    name: str  # the file's path inside its set, e.g. "github/push/to-main.json"
    body: bytes  # the exact file bytes: what is signed and sent
    event: str  # X-GitHub-Event, or the Stripe event's type
    action: str | None  # the GitHub action the file stands for (None for push and ping)
    headers: dict[str, str] = field(repr=False)  # as sent, signed with the set's secret

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def delivery_id(self) -> str:
        if self.provider == "github":
            return self.headers["X-GitHub-Delivery"]
        return str(self.payload["id"])

    @property
    def signed_at(self) -> int:
        """The ``t`` of a Stripe delivery's signature."""
        return int(self.headers["Stripe-Signature"].split(",")[0].removeprefix("t="))

    def header_copy(self) -> dict[str, str]:
        """The headers, as a dict the caller may change."""
        return dict(self.headers)

    def lower_headers(self) -> dict[str, str]:
        """The headers with lower-case names, as a provider's ``parse``/``verify`` get them."""
        return {key.lower(): value for key, value in self.headers.items()}


@dataclass(frozen=True)
class PayloadSet:
    """The deliveries of one payload set, in a stable order (event, then file name)."""

    name: str
    root: Path
    github_secret: str
    stripe_secret: str
    samples: tuple[Sample, ...]

    def github(self, event: str | None = None) -> list[Sample]:
        """The GitHub deliveries, all of them or those of one event."""
        return [
            s
            for s in self.samples
            if s.provider == "github" and (event is None or s.event == event)
        ]

    def stripe(self, type_: str | None = None) -> list[Sample]:
        """The Stripe deliveries, all of them or those of one event type."""
        return [
            s
            for s in self.samples
            if s.provider == "stripe" and (type_ is None or s.event == type_)
        ]

    def one(self, name: str) -> Sample:
        """One delivery by file name inside the set: ``"github/push/to-main.json"``."""
        for sample in self.samples:
            if sample.name == name:
                return sample
        raise LookupError(f"no {name} in the {self.name!r} payload set")

    def stripe_event(self, type_: str) -> Sample:
        """The Stripe delivery of one event type."""
        [sample] = self.stripe(type_)
        return sample

    @property
    def stripe_time(self) -> int:
        """The latest ``t`` the set's Stripe deliveries are signed at."""
        return max(s.signed_at for s in self.stripe())


# -- ours ---------------------------------------------------------------------------------------


def delivery_guid(name: str) -> str:
    """A GUID for ``X-GitHub-Delivery``, stable per file so a rerun sends the same ids."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://django-leases.test/fixtures/{name}"))


def github_headers(
    secret: str, body: bytes, event: str, delivery: str, hook_id: str = GITHUB_HOOK_ID
) -> dict[str, str]:
    """The headers GitHub sends with ``body`` (a ``json`` hook signed with ``secret``)."""
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Hook-ID": hook_id,
        "User-Agent": GITHUB_USER_AGENT,
        "X-Hub-Signature-256": github_signature(secret, body),
        "Content-Type": "application/json",
    }


def stripe_headers(secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers Stripe sends with ``body`` signed with ``secret`` at ``timestamp``."""
    return {
        "Stripe-Signature": stripe_signature(secret, body, timestamp),
        "Content-Type": "application/json; charset=utf-8",
        "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    }


def _our_github(path: Path) -> Sample:
    name = path.relative_to(OURS_DIR).as_posix()
    event = path.parent.name
    body = path.read_bytes()
    payload = json.loads(body)
    # A ping's X-GitHub-Hook-ID is the id of the hook it tests (the body's hook_id).
    hook_id = str(payload["hook_id"]) if event == "ping" else GITHUB_HOOK_ID
    headers = github_headers(GITHUB_SECRET, body, event, delivery_guid(name), hook_id)
    if isinstance(payload.get("repository"), dict):
        headers["X-GitHub-Hook-Installation-Target-Type"] = "repository"
        headers["X-GitHub-Hook-Installation-Target-ID"] = str(payload["repository"]["id"])
    action = None if event in ACTIONLESS_EVENTS else path.stem
    return Sample("github", name, body, event, action, headers)


def _our_stripe(path: Path) -> Sample:
    body = path.read_bytes()
    headers = stripe_headers(STRIPE_SECRET, body, STRIPE_SENT_AT)
    name = path.relative_to(OURS_DIR).as_posix()
    return Sample("stripe", name, body, json.loads(body)["type"], None, headers)


@cache
def ours() -> PayloadSet:
    """``tests/fixtures/``: our own payloads, signed with our test secrets."""
    github = sorted((OURS_DIR / "github").glob("*/*.json"), key=lambda p: (p.parent.name, p.name))
    stripe = sorted((OURS_DIR / "stripe" / "events").glob("*.json"))
    samples = [*(_our_github(p) for p in github), *(_our_stripe(p) for p in stripe)]
    return PayloadSet("ours", OURS_DIR, GITHUB_SECRET, STRIPE_SECRET, tuple(samples))


# -- shared -------------------------------------------------------------------------------------


@cache
def _shared_at(root: Path) -> PayloadSet:
    manifest = json.loads((root / "manifest.json").read_text())
    samples: list[Sample] = []
    for event, entry in sorted(manifest["github"]["events"].items()):
        for item in sorted(entry["files"], key=lambda item: item["file"]):
            headers = dict(item["example_headers"])
            body = (root / item["file"]).read_bytes()
            samples.append(Sample("github", item["file"], body, event, item["action"], headers))
    for item in sorted(manifest["stripe"]["events"], key=lambda item: item["file"]):
        body = (root / item["file"]).read_bytes()
        headers = dict(item["example_headers"])
        samples.append(Sample("stripe", item["file"], body, item["type"], None, headers))
    secrets = manifest["signing_examples"]
    return PayloadSet(
        "shared", root, secrets["github_secret"], secrets["stripe_secret"], tuple(samples)
    )


def shared() -> PayloadSet:
    """``../shared/fixtures/``; a test failure when it is absent (it is asked for only where
    :func:`set_names` offers it: present, or required under CI)."""
    root = SHARED_DIR / "fixtures"
    if not root.is_dir():
        pytest.fail(f"{root} is missing: the run over the real payloads cannot run (CI=true)")
    return _shared_at(root)


def payload_set(name: str) -> PayloadSet:
    """The payload set called ``name`` (``"ours"`` or ``"shared"``)."""
    if name == "ours":
        return ours()
    if name == "shared":
        return shared()
    raise ValueError(f"unknown payload set {name!r}")
