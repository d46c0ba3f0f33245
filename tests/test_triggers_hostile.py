"""The hostile-webhook run: a few thousand refused requests over real HTTP, and one good one.

Every request goes to the live server (pytest-django's ``live_server``: Django's threaded
development server, so real sockets and a real server's header parsing), written byte for byte
by :func:`tests.helpers.raw_request`. The requests are built from a fixed seed and sent in an
order shuffled with it, so a failing run replays the same way (only the ``t`` of the Stripe
signatures follows the clock, as the tolerance wants). Each answer must be the one the
receiving rules give (DESIGN §6, ``docs/howto/trigger-sources.md``) and never a 5xx; nothing a
refused request carried may leave a ``TriggerEvent`` or a ``WorkflowRun``; the one valid
delivery mixed in is recorded once and its replays are answered 200.

What the development server does around the application sets four bounds, each tried at the
view in ``test_triggers_receiving`` instead: header lines stay under its 64 KiB limit (over it,
the server answers 431 itself); a declared length stays under 4 MiB (after the answer the
server reads the rest of the declared body, and a length past ``sys.maxsize`` makes that read
fail in the server); a body without ``Content-Length`` is not handed on (it does not
de-chunk), so an undeclared body over the limit reaches the view empty and is refused for its
signature; and it strips whitespace around header values with ``str.strip()``, so a right
signature ending in a vertical tab never reaches the view. The server's own tracebacks, which
go to stderr, fail the run too.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from django_leases.models import TriggerEvent, TriggerSource, WorkflowRun
from django_leases.triggers import registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.triggers.signatures import github_signature, stripe_signature
from django_leases.triggers.values import Delivery
from django_leases.workflows import workflow
from tests.helpers import raw_request
from tests.payloads import GITHUB_SECRET, STRIPE_SECRET, Sample, ours

SEED = 20251022
#: WEBHOOK_MAX_BODY for the run: small, so bodies over it stay cheap to send.
LIMIT = 16 * 1024
#: At least this many requests are sent.
AT_LEAST = 2000

GITHUB = "hostile-github"
STRIPE = "hostile-stripe"
MANUAL = "hostile-manual"  # a manual source signed Stripe's way
DISABLED = "hostile-disabled"
ORPHANED = "hostile-orphaned"
NO_SECRET = "hostile-no-secret"
UNKNOWN = "hostile-unknown"
WORKFLOW = "test-hostile-build"

#: The GitHub headers that take one value: a comma in one is read as the header sent twice.
SINGLE_VALUED = ("X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event", "Content-Type")
#: Every status the receive view documents but 500 (recording failed), which refused input
#: must never cause.
DOCUMENTED = frozenset({200, 202, 400, 401, 404, 405, 413})


@workflow(WORKFLOW)
def _build(run: Any, input: Any) -> Any:
    return input


def _recorded_only(delivery: Any) -> None:
    """The manual source's handler: no request of the run reaches it."""


@dataclass(frozen=True)
class Probe:
    """One request and the answers the rules allow for it."""

    kind: str
    expect: frozenset[int]
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    content_length: str | None


class Probes:
    """Builds the run's requests from one seeded random source."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.github_samples = ours().github()
        self.stripe_samples = ours().stripe()
        self.valid = ours().one("github/push/to-main.json")
        self.refused: list[Probe] = []
        self.replays: list[Probe] = []

    # -- building blocks -------------------------------------------------------------------

    def fresh_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def sample(self) -> Sample:
        return self.rng.choice(self.github_samples)

    def text(self, size: int, alphabet: str) -> str:
        return "".join(self.rng.choices(alphabet, k=size))

    def noise(self, size: int) -> bytes:
        return self.rng.randbytes(size)

    def path(self, source: str) -> str:
        """The source's address, with or without its trailing slash (both receive)."""
        return f"/hooks/{source}/" if self.rng.random() < 0.5 else f"/hooks/{source}"

    def add(
        self,
        kind: str,
        expect: int | Sequence[int],
        headers: Sequence[tuple[str, str]],
        body: bytes = b"",
        *,
        source: str = GITHUB,
        path: str | None = None,
        method: str = "POST",
        content_length: str | None = "",
        replay: bool = False,
    ) -> None:
        statuses = frozenset([expect] if isinstance(expect, int) else expect)
        probe = Probe(
            kind,
            statuses,
            method,
            path or self.path(source),
            tuple(headers),
            body,
            content_length,
        )
        (self.replays if replay else self.refused).append(probe)

    def github(
        self,
        body: bytes,
        *,
        signature: str | None = "good",
        event: str | None = "push",
        delivery: str | None = "fresh",
        content_type: str | None = "application/json",
        extra: Sequence[tuple[str, str]] = (),
    ) -> list[tuple[str, str]]:
        """GitHub's headers for ``body``: ``"good"`` signs it, ``"fresh"`` is a new id, ``None``
        leaves the header out."""
        headers = [("User-Agent", "GitHub-Hookshot/7d3e0a1")]
        if event is not None:
            headers.append(("X-GitHub-Event", event))
        if delivery is not None:
            headers.append(
                ("X-GitHub-Delivery", self.fresh_id() if delivery == "fresh" else delivery)
            )
        if content_type is not None:
            headers.append(("Content-Type", content_type))
        if signature is not None:
            value = self.good_signature(body) if signature == "good" else signature
            headers.append(("X-Hub-Signature-256", value))
        return [*headers, *extra]

    def good_signature(self, body: bytes) -> str:
        return github_signature(GITHUB_SECRET, body)

    def bad_digest(self) -> str:
        return "sha256=" + self.text(64, "0123456789abcdef")

    def stripe(self, signature: str | None) -> list[tuple[str, str]]:
        """Stripe's headers with ``signature`` (``None`` leaves it out)."""
        headers = [("Content-Type", "application/json; charset=utf-8")]
        return headers if signature is None else [*headers, ("Stripe-Signature", signature)]

    def stripe_source(self) -> str:
        return self.rng.choice([STRIPE, MANUAL])

    # -- the kinds of request --------------------------------------------------------------

    def sources(self) -> None:
        for _ in range(40):
            for source, status in ((UNKNOWN, 404), (DISABLED, 404), (ORPHANED, 404)):
                body = self.sample().body
                self.add(f"source {source}", status, self.github(body), body, source=source)
            body = self.sample().body
            self.add("source without secret", 401, self.github(body), body, source=NO_SECRET)
        for _ in range(80):
            name = "x-" + self.text(
                self.rng.randint(1, 40), "abcdefghijklmnopqrstuvwxyz0123456789-_.~"
            )
            body = self.sample().body
            self.add("source random name", 404, self.github(body), body, source=name)
        for _ in range(60):
            encoded = "".join(f"%{byte:02X}" for byte in self.noise(self.rng.randint(1, 30)))
            body = self.sample().body
            path = f"/hooks/{encoded}" + self.rng.choice(["", "/"])
            self.add("source random bytes", 404, self.github(body), body, path=path)
        for path in [
            "/hooks/",
            "/hooks//",
            f"/hooks/{GITHUB}/more/",
            f"/hooks/{GITHUB}//",
            "/hook/x/",
        ]:
            body = self.sample().body
            self.add("path not routed", 404, self.github(body), body, path=path)

    def methods(self) -> None:
        verbs = ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]
        for _ in range(120):
            verb = self.rng.choice(
                [*verbs, self.text(self.rng.randint(5, 10), "ABCDEFGHIJKLMNOPQRSTUVWXYZ")]
            )
            source = self.rng.choice([GITHUB, STRIPE, UNKNOWN, DISABLED])
            body = self.sample().body if self.rng.random() < 0.5 else b""
            self.add(
                f"method {verb if verb in verbs else 'random'}",
                405,
                self.github(body),
                body,
                source=source,
                method=verb,
            )

    def github_signatures(self) -> None:
        def each(
            count: int, kind: str, expect: int, signature: Callable[[bytes, str], Any]
        ) -> None:
            for _ in range(count):
                body = self.sample().body
                value = signature(body, self.good_signature(body))
                headers = self.github(body, signature=None)
                pairs = value if isinstance(value, list) else [value]
                headers += [("X-Hub-Signature-256", item) for item in pairs if item is not None]
                self.add(kind, expect, headers, body)

        each(30, "signature missing", 401, lambda body, good: None)
        each(10, "signature empty", 401, lambda body, good: "")
        each(30, "signature wrong digest", 401, lambda body, good: self.bad_digest())
        each(
            50, "signature truncated", 401, lambda body, good: good[: self.rng.randrange(len(good))]
        )
        each(
            30,
            "signature oversized",
            401,
            lambda body, good: good + self.text(self.rng.randint(1, 4000), "0123456789abcdef"),
        )
        each(
            15, "signature other secret", 401, lambda body, good: github_signature("not-ours", body)
        )
        each(15, "signature other body", 401, lambda body, good: self.good_signature(body + b" "))
        prefixes = ["sha1=", "SHA256=", "sha256:", "sha512=", "sha256==", "", "sha256 ="]
        each(
            30,
            "signature wrong prefix",
            401,
            lambda body, good: self.rng.choice(prefixes) + good.removeprefix("sha256="),
        )
        inner = [" ", "\t", "\x0b", "\x0c", "\x00", "\x7f", "\xa0", "\x85", ";", "=", "é", "\x1f"]

        def inserted(body: bytes, good: str) -> str:
            at = self.rng.randrange(1, len(good))
            return good[:at] + self.rng.choice(inner) + good[at:]

        each(80, "signature inner character", 401, inserted)
        ends = [";", ".", "x", "0", "\x00", "\x7f", "=", "'", '"']
        each(
            40,
            "signature character at an end",
            401,
            lambda body, good: (
                self.rng.choice(ends) + good
                if self.rng.random() < 0.5
                else good + self.rng.choice(ends)
            ),
        )
        each(
            25,
            "signature joined with a comma",
            400,
            lambda body, good: f"{good},{self.rng.choice([good, self.bad_digest()])}",
        )
        each(
            40,
            "signature sent twice",
            400,
            lambda body, good: self.rng.choice(
                [[good, good], [good, self.bad_digest()], [self.bad_digest(), good]]
            ),
        )
        for _ in range(15):
            body = self.sample().body
            # 80 more: the server itself refuses over 100 header lines (431).
            junk = [(f"X-Junk-{i}", self.text(500, "abcdef0123456789")) for i in range(80)]
            big = "sha256=" + self.text(self.rng.randint(8000, 60000), "0123456789abcdef")
            self.add("huge signature header", 401, self.github(body, signature=big), body)
            self.add(
                "many headers",
                401,
                self.github(body, signature=self.bad_digest(), extra=junk),
                body,
            )

    def github_headers(self) -> None:
        rules: list[tuple[str, int, dict[str, Any]]] = [
            ("event missing", 10, {"event": None}),
            ("delivery missing", 10, {"delivery": None}),
            ("event empty", 5, {"event": ""}),
        ]
        for kind, count, change in rules:
            for _ in range(count):
                body = self.sample().body
                self.add(kind, 400, self.github(body, **change), body)
        for _ in range(20):
            body = self.sample().body
            joined = f"{self.fresh_id()},{self.fresh_id()}"
            self.add("delivery joined with a comma", 400, self.github(body, delivery=joined), body)
            extra = [("X-GitHub-Delivery", self.fresh_id())]
            self.add("delivery sent twice", 400, self.github(body, extra=extra), body)
            self.add(
                "event sent twice", 400, self.github(body, extra=[("X-GitHub-Event", "push")]), body
            )
            self.add("event joined with a comma", 400, self.github(body, event="push,issues"), body)
            content_type = "application/json,application/x-www-form-urlencoded"
            self.add(
                "content type joined with a comma",
                400,
                self.github(body, content_type=content_type),
                body,
            )
        controls = ["\x00", "\x01", "\x0b", "\x1b", "\x7f", "\x85", "\xa0"]
        for _ in range(20):
            body = self.sample().body
            guid = self.fresh_id()
            at = self.rng.randrange(1, len(guid))
            broken = guid[:at] + self.rng.choice(controls) + guid[at:]
            self.add(
                "delivery with a control character", 400, self.github(body, delivery=broken), body
            )
            self.add(
                "event with a control character",
                400,
                self.github(body, event="pu" + self.rng.choice(controls) + "sh"),
                body,
            )
        for _ in range(15):
            body = self.sample().body
            long_id = self.text(self.rng.randint(201, 60000), "0123456789abcdef-")
            self.add("delivery huge", 400, self.github(body, delivery=long_id), body)
            self.add(
                "event huge", 400, self.github(body, event="e" * self.rng.randint(201, 60000)), body
            )

    def bodies(self) -> None:
        def signed(kind: str, body: bytes, content_type: str = "application/json") -> None:
            self.add(kind, 400, self.github(body, content_type=content_type), body)

        for _ in range(60):
            whole = self.sample().body.rstrip()
            signed("json truncated", whole[: self.rng.randrange(1, len(whole))])
        for body in [
            b"{",
            b"}",
            b"{'ref': 1}",
            b'{"ref": 1,}',
            b"{ref: 1}",
            b'{"a" 1}',
            b'{"a": }',
            b"nul",
        ]:
            signed("json malformed", body)
        for body in [
            b"[]",
            b"[1, 2]",
            b'"ref"',
            b"1",
            b"1.5",
            b"null",
            b"true",
            b"false",
            b'[{"ref": "x"}]',
        ]:
            signed("json not an object", body)
            signed("json not an object", b"  " + body + b"\n")
        for _ in range(15):
            depth = self.rng.randint(65, (LIMIT - 10) // 7)  # '{"a": ' and '}' per level
            signed("json deep objects", b'{"a": ' * depth + b"1" + b"}" * depth)
            depth = self.rng.randint(65, (LIMIT - 10) // 2)  # '[' and ']' per level
            signed("json deep lists", b'{"a": ' + b"[" * depth + b"]" * depth + b"}")
        for _ in range(15):
            signed(
                "json nul",
                self.rng.choice(
                    [b'{"ref": "a\\u0000b"}', b'{"\\u0000": 1}', b'{"a": ["x", {"b": "\\u0000"}]}']
                ),
            )
            signed(
                "json lone surrogate",
                self.rng.choice(
                    [
                        b'{"ref": "\\ud800"}',
                        b'{"ref": "\\udc00x"}',
                        b'{"\\udbff": 1}',
                        b'{"a": ["\\ud83d"]}',
                    ]
                ),
            )
        for body in [
            b'{"n": NaN}',
            b'{"n": Infinity}',
            b'{"n": -Infinity}',
            b'{"n": 1e400}',
            b'{"n": -1e999}',
        ]:
            signed("json not finite", body)
            signed("json not finite", body.replace(b'"n"', b'"ref"'))
        for _ in range(10):
            signed("json bad utf-8", b'{"ref": "' + bytes([self.rng.randint(0x80, 0xFF)]) + b'"}')
            whole = self.sample().body
            encoding = self.rng.choice(["utf-16", "utf-32", "utf-8-sig"])
            signed(
                "json other encoding",
                whole.decode().encode(encoding),
                f"application/json; charset={encoding}",
            )
        for _ in range(5):
            signed("body empty", b"")
        for _ in range(250):
            signed("body random bytes", self.noise(self.rng.randint(1, LIMIT)))
        form = "application/x-www-form-urlencoded"
        for _ in range(10):
            whole = self.sample().body
            signed("form of json", whole, form)
            signed("form without payload", b"ref=refs%2Fheads%2Fmain", form)
            signed("form payload twice", b"payload=%7B%7D&payload=%7B%7D", form)
            signed("form payload not json", b"payload=" + self.text(20, "abcdef").encode(), form)
            signed("form random bytes", self.noise(self.rng.randint(1, 2000)), form)

    def content_types(self) -> None:
        kinds = [
            "text/plain",
            "multipart/form-data; boundary=x",
            "application/xml",
            "",
            "garbage/",
            "application/json; charset=utf-7",
            "application/x-www-form-urlencoded",
        ]
        for _ in range(60):
            body = self.sample().body
            content_type = self.rng.choice([*kinds, self.text(40, "abcdefghij/;=+ ")])
            headers = self.github(body, signature=self.bad_digest(), content_type=content_type)
            self.add("content type odd, signature bad", 401, headers, body)
        for _ in range(20):
            body = self.noise(self.rng.randint(1, 400))
            content_type = self.rng.choice(kinds[:3])
            self.add(
                "content type odd, body not json",
                400,
                self.github(body, content_type=content_type),
                body,
            )

    def lengths(self) -> None:
        for _ in range(40):
            size = self.rng.randint(LIMIT + 1, 4 * LIMIT)
            body = self.noise(size)
            signature = "good" if self.rng.random() < 0.5 else self.bad_digest()
            self.add("over the limit, declared", 413, self.github(body, signature=signature), body)
        for _ in range(20):
            declared = str(self.rng.randint(4 * LIMIT, 4 * 1024 * 1024))
            body = self.noise(self.rng.randint(0, 2000))
            self.add(
                "over the limit, declared not sent",
                413,
                self.github(body),
                body,
                content_length=declared,
            )
        for _ in range(20):
            body = self.noise(self.rng.randint(LIMIT + 1, 4 * LIMIT))
            self.add(
                "over the limit, undeclared", 401, self.github(body), body, content_length=None
            )
        for _ in range(10):
            body = self.noise(self.rng.randint(LIMIT + 1, 4 * LIMIT))
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            headers = self.github(body, extra=[("Transfer-Encoding", "chunked")])
            # WSGI hands Django no body without a length: told to send one (400).
            self.add("over the limit, chunked", 400, headers, chunked, content_length=None)
        for _ in range(10):
            body = self.noise(self.rng.randint(LIMIT + 1, 4 * LIMIT))
            self.add(
                "over the limit, length lying", 401, self.github(body), body, content_length="100"
            )
        written = [
            "+{n}",
            "{n} ",
            "{n}\t",
            "0x{n:x}",
            "{n}.0",
            "{n},{n}",
            "{n}_0",
            "-{n}",
            "abc",
            "{n}²",
            "1e3",
            "{n}\x00",
        ]
        for _ in range(80):
            sample = self.sample()
            length = self.rng.choice(written).format(n=len(sample.body))
            self.add(
                "length not plain digits",
                400,
                self.github(sample.body),
                sample.body,
                content_length=length,
            )
        for _ in range(5):
            body = self.sample().body
            headers = self.github(
                body, signature=self.bad_digest(), extra=[("Content-Length", "3")]
            )
            self.add("length sent twice", 401, headers, body)

    def stripe_signatures(self) -> None:
        def each(
            count: int, kind: str, expect: int, signature: Callable[[bytes, int, str], str | None]
        ) -> None:
            for _ in range(count):
                body = self.rng.choice(self.stripe_samples).body
                now = int(time.time())
                good = stripe_signature(STRIPE_SECRET, body, now)
                header = signature(body, now, good)
                self.add(kind, expect, self.stripe(header), body, source=self.stripe_source())

        hex_digits = "0123456789abcdef"
        each(20, "stripe missing", 401, lambda body, now, good: None)
        each(5, "stripe empty", 401, lambda body, now, good: "")
        each(
            20,
            "stripe wrong digest",
            401,
            lambda body, now, good: f"t={now},v1={self.text(64, hex_digits)}",
        )
        each(
            25,
            "stripe stale",
            401,
            lambda body, now, good: stripe_signature(
                STRIPE_SECRET, body, now - self.rng.randint(301, 10**6)
            ),
        )
        each(
            25,
            "stripe truncated",
            401,
            lambda body, now, good: good[: self.rng.randrange(len(good))],
        )
        each(
            10,
            "stripe other secret",
            401,
            lambda body, now, good: stripe_signature("whsec_not_ours", body, now),
        )
        rewrites: list[Callable[[str], str]] = [
            lambda good: good.replace(",", ", "),
            lambda good: good.replace(",", " ,"),
            lambda good: good.replace("t=", "t ="),
            lambda good: good.replace("v1=", "v1= "),
            lambda good: good.replace(",", ",\x0b"),
            lambda good: good.replace(",", ",\t"),
            lambda good: good.replace("v1=", "V1="),
            lambda good: good + ",x=1",
            lambda good: good + ",",
            lambda good: good.replace(",", ",,"),
            lambda good: good.replace(",", ";"),
            lambda good: good + ",v0=a b",
            lambda good: good.replace("v1=", "v0="),
            lambda good: good + "0",
            lambda good: good.replace("t=", "t=+"),
        ]
        each(
            60,
            "stripe written otherwise",
            401,
            lambda body, now, good: self.rng.choice(rewrites)(good),
        )
        each(20, "stripe joined with a comma", 400, lambda body, now, good: f"{good},{good}")
        each(
            10,
            "stripe two timestamps",
            400,
            lambda body, now, good: good.replace(",", f",t={now},"),
        )
        for _ in range(20):
            body = self.rng.choice(self.stripe_samples).body
            good = stripe_signature(STRIPE_SECRET, body, int(time.time()))
            twice = [*self.stripe(good), ("Stripe-Signature", good)]
            self.add("stripe sent twice", 400, twice, body, source=self.stripe_source())
        each(
            10,
            "stripe huge",
            401,
            lambda body, now, good: (
                good + ",v0=" + self.text(self.rng.randint(5000, 60000), hex_digits)
            ),
        )
        not_events = [
            b"[]",
            b"nope",
            b"",
            b'{"type": "invoice.paid"}',
            b'{"id": "evt_1"}',
            b'{"id": 5, "type": "invoice.paid"}',
            b'{"id": "evt_\\u0000", "type": "invoice.paid"}',
            b'{"id": "evt_1", "type": "' + b"t" * 300 + b'"}',
            b'{"id": "evt_1", "type": "invoice.paid", "data": "\\udc00"}',
        ]
        for _ in range(45):
            body = self.rng.choice([*not_events, self.noise(self.rng.randint(1, 3000))])
            signature = stripe_signature(STRIPE_SECRET, body, int(time.time()))
            self.add(
                "stripe signed, not an event",
                400,
                self.stripe(signature),
                body,
                source=self.stripe_source(),
            )

    def random_headers(self) -> None:
        alphabet = "".join(chr(c) for c in range(0x00, 0x100) if chr(c) not in "\r\n")
        for _ in range(250):
            body = self.sample().body
            name = self.rng.choice(
                [*SINGLE_VALUED, "User-Agent", f"X-Random-{self.rng.randint(0, 9)}"]
            )
            value = self.text(self.rng.randint(1, 2000), alphabet)
            headers = [
                pair
                for pair in self.github(body, signature=self.bad_digest())
                if pair[0] != name or name == "User-Agent"
            ]
            headers.append((name, value))
            # A comma makes a single-valued header "repeated" (400), unless the server's own
            # parsing cut the value before it; without one, the signature is what refuses.
            expect = (400, 401) if name in SINGLE_VALUED and "," in value else (401,)
            self.add(
                f"random {name if name in SINGLE_VALUED else 'other'} header", expect, headers, body
            )

    def replays_of_the_valid_one(self) -> None:
        valid = self.valid
        delivery = valid.delivery_id
        for _ in range(40):
            self.add("replay", 200, list(valid.headers.items()), valid.body, replay=True)
        for _ in range(20):
            body = self.sample().body
            self.add(
                "replay, another body", 200, self.github(body, delivery=delivery), body, replay=True
            )
        for _ in range(15):
            tampered = valid.body.replace(b"main", b"evil", 1)
            self.add("replay, tampered", 401, list(valid.headers.items()), tampered, replay=True)
            twice = [*valid.headers.items(), ("X-GitHub-Delivery", delivery)]
            self.add("replay, delivery sent twice", 400, twice, valid.body, replay=True)

    # -- the run ---------------------------------------------------------------------------

    def build(self) -> list[Probe]:
        """Every request in the order sent: the valid delivery in the first third, its replays
        after it, all else shuffled."""
        for kinds in (
            self.sources,
            self.methods,
            self.github_signatures,
            self.github_headers,
            self.bodies,
            self.content_types,
            self.lengths,
            self.stripe_signatures,
            self.random_headers,
            self.replays_of_the_valid_one,
        ):
            kinds()
        refused = list(self.refused)
        self.rng.shuffle(refused)
        cut = self.rng.randrange(len(refused) // 3)
        after = refused[cut:] + self.replays
        self.rng.shuffle(after)
        valid = Probe(
            "the valid delivery",
            frozenset({202}),
            "POST",
            self.path(GITHUB),
            tuple(self.valid.headers.items()),
            self.valid.body,
            "",
        )
        return [*refused[:cut], valid, *after]


@pytest.fixture
def hostile_sources(settings: Any, transactional_db: None) -> Iterator[None]:
    """The run's sources: GitHub, Stripe and manual-Stripe enabled; one disabled; one
    orphaned (enabled, its declaration gone); one enabled without a signing secret."""
    push = {"push": StartWorkflow(WORKFLOW)}
    webhook_source(GITHUB, provider="github", events=push)
    webhook_source(STRIPE, provider="stripe", events={"invoice.paid": StartWorkflow(WORKFLOW)})
    webhook_source(
        MANUAL,
        provider="manual",
        config={"signature": "stripe"},
        events={"customer.created": _recorded_only},
    )
    for name in (DISABLED, ORPHANED, NO_SECRET):
        webhook_source(name, provider="github", events=push)
    secrets = {name: GITHUB_SECRET for name in (GITHUB, DISABLED, ORPHANED)}
    settings.DJANGO_LEASES = {
        "WEBHOOK_SECRETS": {**secrets, STRIPE: STRIPE_SECRET, MANUAL: STRIPE_SECRET},
        "WEBHOOK_MAX_BODY": LIMIT,
    }
    try:
        TriggerSource.objects.sync(registry.declarations())
        for name in (GITHUB, STRIPE, MANUAL, ORPHANED, NO_SECRET):
            TriggerSource.objects.set_enabled(name, True)
        registry.unregister(ORPHANED)
        TriggerSource.objects.sync(registry.declarations())
        assert TriggerSource.objects.get(name=ORPHANED).declared is False
        yield
    finally:
        for name in (GITHUB, STRIPE, MANUAL, DISABLED, ORPHANED, NO_SECRET):
            registry.unregister(name)


def _send(live_server: Any, probe: Probe) -> Any:
    return raw_request(
        live_server.url,
        probe.method,
        probe.path,
        probe.headers,
        probe.body,
        content_length=probe.content_length,
    )


@pytest.mark.slow
def test_hostile_requests_over_http_leave_nothing_but_the_valid_delivery(
    hostile_sources: None, live_server: Any, caplog: Any, capfd: Any
) -> None:
    # Every refusal is a warning of django.server / django.request: keep only errors (a 5xx).
    caplog.set_level(logging.ERROR, logger="django.server")
    caplog.set_level(logging.ERROR, logger="django.request")
    probes = Probes(SEED).build()
    assert len(probes) >= AT_LEAST

    started = time.monotonic()
    statuses: Counter[int] = Counter()
    wrong: list[str] = []
    for number, probe in enumerate(probes):
        answer = _send(live_server, probe)
        statuses[answer.status] += 1
        if answer.status not in probe.expect:
            wrong.append(f"#{number} {probe.kind}: {answer.status} {answer.body[:160]!r}")
        if answer.headers.get("content-type") == "application/json" and answer.status >= 400:
            assert "error" in json.loads(answer.body), (probe.kind, answer.body)
        for secret in (GITHUB_SECRET, STRIPE_SECRET):
            assert secret.encode() not in answer.body
    elapsed = time.monotonic() - started
    server_errors = capfd.readouterr().err  # the server's own tracebacks go to stderr

    shown = ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items()))
    print(f"\nhostile run: {len(probes)} requests in {elapsed:.1f} s; statuses {shown}")
    assert not wrong, f"{len(wrong)} unexpected answers:\n" + "\n".join(wrong[:40])
    assert not [status for status in statuses if status >= 500]
    assert set(statuses) <= DOCUMENTED
    assert statuses[202] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[:2000]
    assert "Traceback" not in server_errors, server_errors[:2000]

    valid = ours().one("github/push/to-main.json")
    event = TriggerEvent.objects.get()  # exactly one row: refused input left none
    assert (event.source_name, event.delivery_id, event.event) == (
        GITHUB,
        valid.delivery_id,
        "push",
    )
    run = WorkflowRun.objects.get()
    assert (event.run_id, run.workflow, run.input) == (run.pk, WORKFLOW, valid.payload)


class _UnprintableText(str):
    """Text whose own methods raise (a project's ``run`` callable may return anything)."""

    def __str__(self) -> str:
        raise RuntimeError("no text")

    def strip(self, chars: Any = None) -> str:
        raise RuntimeError("no strip")


class _UnprintableUUID(uuid.UUID):
    """A UUID whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "named",
    [_UnprintableText("01a24958-4b6d-754b-8f91-23bfe3afce55"), _UnprintableUUID(int=7)],
    ids=["str-subclass", "uuid-subclass"],
)
def test_a_send_event_run_callable_returning_a_hostile_subclass_gets_an_outcome(
    named: Any,
) -> None:
    """Whatever the ``run`` callable returns, the handler answers with an outcome and never
    raises (the receiver would answer 500 and the provider retry for ever)."""
    handler = registry.SendEvent("go", run=lambda delivery: named)
    delivery = Delivery(
        source="hostile", provider="fake", event="push", delivery_id="d-1", payload={}
    )
    handled = handler(delivery)
    assert handled.run_id is None
    assert isinstance(handled.outcome, str) and handled.outcome
