"""GitHub and Stripe signatures and delivery parsing, against the worked examples and every
payload: ours (``tests/fixtures/``), then the real ones in ``../shared/fixtures/`` with its
manifest's example headers, which were signed there, not by our signer."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
import time_machine

from django_leases.triggers.errors import MalformedDelivery
from django_leases.triggers.providers import (
    MAX_PAYLOAD_DEPTH,
    GitHubProvider,
    ManualProvider,
    StripeProvider,
    decode_json_object,
)
from django_leases.triggers.signatures import (
    github_signature,
    parse_stripe_header,
    stripe_signature,
    verify_github_signature,
    verify_stripe_signature,
)
from tests.payloads import PayloadSet

#: The GitHub events both payload sets hold deliveries of.
GITHUB_EVENTS = {"push", "ping", "issues", "pull_request", "release", "workflow_run", "check_run"}
STRIPE_TYPES = {
    "charge.succeeded",
    "checkout.session.completed",
    "customer.created",
    "invoice.paid",
    "payment_intent.succeeded",
}


def _hmac_hex(secret: str, message: bytes) -> str:
    """HMAC-SHA256 straight from the standard library, to check our signer against."""
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


# -- the signer ------------------------------------------------------------------------------


def test_signer_matches_githubs_documented_vector() -> None:
    # GitHub's "Validating webhook deliveries" example (also in ../shared/fixtures/README.md).
    assert github_signature("It's a Secret to Everybody", b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_signer_matches_the_readmes_second_vector() -> None:
    body = b'{"zen":"Design for failure.","hook_id":1}'
    assert github_signature("s3cr3t", body) == (
        "sha256=249af1ce99a079bae70d0169c066a8f6dd3f1be979a531df6e8a7b9248a8a896"
    )


def test_signer_matches_every_signed_header(payload_set: PayloadSet) -> None:
    secret = payload_set.github_secret
    samples = payload_set.github()
    assert {s.event for s in samples} >= GITHUB_EVENTS
    for sample in samples:
        header = sample.headers["X-Hub-Signature-256"]
        assert header == "sha256=" + _hmac_hex(secret, sample.body), sample.name
        assert github_signature(secret, sample.body) == header, sample.name
        assert verify_github_signature(secret, sample.body, header)


def test_signer_refuses_an_empty_secret() -> None:
    with pytest.raises(ValueError, match="secret"):
        github_signature("", b"x")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "sha256=",
        "sha1=757107ea0eb2509fc211221cce984b8a37570b6d",
        "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e18",
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e1",
        "sha256=ÿÿ",  # latin-1 text from a header: unequal, never a TypeError
    ],
)
def test_verify_refuses_missing_and_wrong_headers(header: str | None) -> None:
    assert not verify_github_signature("It's a Secret to Everybody", b"Hello, World!", header)


def test_verify_refuses_a_tampered_body_and_another_secret() -> None:
    header = github_signature("right", b"body")
    assert verify_github_signature("right", b"body", header)
    assert verify_github_signature("right", b"body", header.upper().replace("SHA256", "sha256"))
    assert not verify_github_signature("right", b"body ", header)
    assert not verify_github_signature("wrong", b"body", header)
    assert not verify_github_signature("", b"body", header)


#: GitHub's documented vector: "Hello, World!" signed with "It's a Secret to Everybody".
_VECTOR = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


@pytest.mark.parametrize(
    "header",
    [
        " " + _VECTOR,
        _VECTOR + " ",
        "\t " + _VECTOR + " \t",
        "sha256=" + _VECTOR.removeprefix("sha256=").upper(),
    ],
)
def test_verify_allows_only_http_whitespace_around_the_value(header: str) -> None:
    assert verify_github_signature("It's a Secret to Everybody", b"Hello, World!", header)


@pytest.mark.parametrize(
    "header",
    [
        _VECTOR + "\x0b",  # vertical tab: str.strip() would take it off
        "\x0b" + _VECTOR,
        _VECTOR + "\x0c",
        _VECTOR + "\r",
        _VECTOR + "\n",
        _VECTOR + "\r\n",
        _VECTOR + "\x00",
        _VECTOR + "\x85",  # NEL, a latin-1 header byte str.strip() takes for whitespace
        "\xa0" + _VECTOR,  # no-break space
        _VECTOR + "\u3000",
        "sha256= " + _VECTOR.removeprefix("sha256="),
        "sha256=\t" + _VECTOR.removeprefix("sha256="),
        _VECTOR[:20] + " " + _VECTOR[20:],
        _VECTOR[:20] + "\x0b" + _VECTOR[20:],
        "SHA256=" + _VECTOR.removeprefix("sha256="),
        "sha256 =" + _VECTOR.removeprefix("sha256="),
        _VECTOR + "0",
        _VECTOR + ",",
        _VECTOR + ";",
    ],
)
def test_verify_refuses_any_other_character_around_or_inside(header: str) -> None:
    assert not verify_github_signature("It's a Secret to Everybody", b"Hello, World!", header)


# -- parsing ---------------------------------------------------------------------------------


def _headers(event: str | None = "push", delivery: str | None = "d-1", **extra: str) -> dict:
    headers = {"content-type": "application/json", **extra}
    if event is not None:
        headers["x-github-event"] = event
    if delivery is not None:
        headers["x-github-delivery"] = delivery
    return headers


def test_parse_reads_every_payload(payload_set: PayloadSet) -> None:
    provider = GitHubProvider()
    for sample in payload_set.github():
        parsed = provider.parse(sample.body, sample.lower_headers())
        assert parsed.event == sample.event == sample.headers["X-GitHub-Event"]
        assert parsed.delivery_id == sample.delivery_id == sample.headers["X-GitHub-Delivery"]
        assert parsed.payload == json.loads(sample.body)
        assert parsed.payload.get("action") == sample.action, sample.name


def test_parse_reads_githubs_form_content_type(payloads: PayloadSet) -> None:
    from urllib.parse import urlencode

    raw = payloads.one("github/push/to-main.json").body
    body = urlencode({"payload": raw.decode()}).encode()
    headers = _headers(**{"content-type": "application/x-www-form-urlencoded"})
    assert GitHubProvider().parse(body, headers).payload == json.loads(raw)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (_headers(event=None), "X-GitHub-Event"),
        (_headers(delivery=None), "X-GitHub-Delivery"),
        (_headers(event="  "), "X-GitHub-Event"),
        (_headers(delivery="x" * 201), "longer"),
        (_headers(event="push\x01"), "control"),
    ],
)
def test_parse_refuses_bad_headers(headers: dict, message: str) -> None:
    with pytest.raises(MalformedDelivery, match=message):
        GitHubProvider().parse(b"{}", headers)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe{}",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1e999}',
        b'{"a": "nul \\u0000 inside"}',
        b'{"nul\\u0000key": 1}',
        b'{"a": "\\ud800"}',
        b'{"a": ' * 5000 + b"1" + b"}" * 5000,
        b'{"a": ' + b"[" * (MAX_PAYLOAD_DEPTH + 1) + b"]" * (MAX_PAYLOAD_DEPTH + 1) + b"}",
    ],
)
def test_parse_refuses_bodies_a_json_column_cannot_hold(body: bytes) -> None:
    with pytest.raises(MalformedDelivery):
        GitHubProvider().parse(body, _headers())


@pytest.mark.parametrize(
    "body",
    [b"payload=1&payload=2", b"other=1", b"payload=%7B", b"payload=%FF"],
)
def test_parse_refuses_bad_forms(body: bytes) -> None:
    headers = _headers(**{"content-type": "application/x-www-form-urlencoded"})
    with pytest.raises(MalformedDelivery):
        GitHubProvider().parse(body, headers)


def test_decode_keeps_unicode_and_big_numbers_exactly() -> None:
    payload = decode_json_object('{"name": "Zoë 🚀", "n": 12345678901234567890, "f": 1.5}')
    assert payload == {"name": "Zoë 🚀", "n": 12345678901234567890, "f": 1.5}


# -- Stripe ------------------------------------------------------------------------------------

STRIPE_T = 1679493232


def test_stripe_signer_matches_the_readmes_worked_example() -> None:
    body = b'{"id":"evt_test","object":"event"}'
    expected = "t=1679493232,v1=cab847bfbee51ad086efc71a020aba4a0a7c73649c93dc6169558a45e9da93ba"
    assert stripe_signature("whsec_test_secret", body, STRIPE_T) == expected
    assert verify_stripe_signature("whsec_test_secret", body, expected, now=STRIPE_T)


def test_stripe_signer_matches_every_signed_header(payload_set: PayloadSet) -> None:
    secret = payload_set.stripe_secret
    samples = payload_set.stripe()
    assert {s.event for s in samples} == STRIPE_TYPES
    for sample in samples:
        header, t = sample.headers["Stripe-Signature"], sample.signed_at
        assert header == f"t={t},v1=" + _hmac_hex(secret, b"%d." % t + sample.body), sample.name
        assert stripe_signature(secret, sample.body, t) == header, sample.name
        assert verify_stripe_signature(secret, sample.body, header, now=t + 60)
        assert not verify_stripe_signature("whsec_other", sample.body, header, now=t)
        assert not verify_stripe_signature(secret, sample.body + b" ", header, now=t)


def test_stripe_parse_reads_every_event(payload_set: PayloadSet) -> None:
    provider = StripeProvider()
    for sample in payload_set.stripe():
        parsed = provider.parse(sample.body, sample.lower_headers())
        payload = json.loads(sample.body)
        assert parsed.event == sample.event == payload["type"]
        assert parsed.delivery_id == payload["id"]
        assert parsed.delivery_id.startswith("evt_")
        assert parsed.payload == payload


def test_stripe_verify_through_the_provider_honours_the_tolerance(
    payloads: PayloadSet, settings: Any
) -> None:
    sample = payloads.stripe_event("invoice.paid")
    body, headers, t = sample.body, sample.lower_headers(), sample.signed_at
    secret = payloads.stripe_secret
    provider = StripeProvider()
    with time_machine.travel(t + 299, tick=False):
        assert provider.verify(secret, body, headers)
    with time_machine.travel(t + 301, tick=False):
        assert not provider.verify(secret, body, headers)  # a replay
        settings.DJANGO_LEASES = {"STRIPE_TOLERANCE": 600}
        assert provider.verify(secret, body, headers)
        # A typo cannot switch replay protection off: the default applies.
        for unusable in (0, -1, "600", None, True):
            settings.DJANGO_LEASES = {"STRIPE_TOLERANCE": unusable}
            assert not provider.verify(secret, body, headers)


def test_stripe_accepts_any_v1_and_ignores_v0() -> None:
    body = b'{"id":"evt_1","type":"x"}'
    good = stripe_signature("whsec_a", body, STRIPE_T).split("v1=")[1]
    other = stripe_signature("whsec_b", body, STRIPE_T).split("v1=")[1]
    rotating = f"t={STRIPE_T},v1={other},v1={good},v0={'0' * 64}"
    assert verify_stripe_signature("whsec_a", body, rotating, now=STRIPE_T)
    assert verify_stripe_signature("whsec_b", body, rotating, now=STRIPE_T)
    assert not verify_stripe_signature("whsec_c", body, rotating, now=STRIPE_T)
    # v0 alone never verifies, even when it holds the right digest.
    assert not verify_stripe_signature("whsec_a", body, f"t={STRIPE_T},v0={good}", now=STRIPE_T)
    assert parse_stripe_header(rotating) == (STRIPE_T, [other, good])


def test_stripe_signed_timestamp_is_part_of_the_signature() -> None:
    body = b"{}"
    digest = stripe_signature("whsec_a", body, STRIPE_T).split("v1=")[1]
    moved = f"t={STRIPE_T + 100},v1={digest}"
    assert not verify_stripe_signature("whsec_a", body, moved, now=STRIPE_T + 100)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "v1=abc",
        f"t={STRIPE_T}",
        f"t=,v1={'a' * 64}",
        f"t=-5,v1={'a' * 64}",
        f"t=12x,v1={'a' * 64}",
        f"t=1,t=2,v1={'a' * 64}",
        f"t={STRIPE_T},v1=ÿÿ",
        "t=1," + "v1=a," * 5000,
    ],
)
def test_stripe_verify_refuses_malformed_headers(header: str | None) -> None:
    assert not verify_stripe_signature("whsec_a", b"{}", header, now=STRIPE_T)


def _stripe_example() -> tuple[str, str]:
    """The README's worked example: its signed header, and its v1 digest."""
    header = "t=1679493232,v1=cab847bfbee51ad086efc71a020aba4a0a7c73649c93dc6169558a45e9da93ba"
    return header, header.split("v1=")[1]


_STRIPE_BODY = b'{"id":"evt_test","object":"event"}'


#: Stripe-Signature values as written, ``{h}`` the signed header, ``{t}`` its timestamp, ``{d}``
#: its digest (``{D}`` in upper case), ``{z}`` a wrong digest, ``{short}`` one digit short.
_STRIPE_READ = [
    "{h}",
    " {h}\t",
    "t={t},v1={d},v0={d}",
    "v1={d},t={t}",
    "t={t},v1={z},v1={d}",
    "t={t},v1={D}",
    "t={t},v1={d},v0=Zm9vYmFy==",
    "t={t},v1={d},v9=x",
]
_STRIPE_REFUSED = [
    "{h}\x0b",
    "\x0b{h}",
    "{h}\x0c",
    "{h}\r\n",
    "{h}\x00",
    "{h}\x85",
    "\xa0{h}",
    "t={t}, v1={d}",
    "t={t} ,v1={d}",
    "t ={t},v1={d}",
    "t= {t},v1={d}",
    "t={t},v1= {d}",
    "t={t},\tv1={d}",
    "t={t},v1={d},",
    ",t={t},v1={d}",
    "t={t},,v1={d}",
    "t={t};v1={d}",
    "T={t},v1={d}",
    "t={t},V1={d}",
    "t={t},v1={d},x=1",
    "t={t},v1={d},v0",
    "t={t},v1={d},v0=a b",
    "t={t},v1={d},v0=é",
    "t={t},v1={d}0",
    "t={t},v1={short}",
    "t=+{t},v1={d}",
    "t={t}\u0660,v1={d}",
]


@pytest.mark.parametrize(
    ("header", "accepted"),
    [*((header, True) for header in _STRIPE_READ), *((h, False) for h in _STRIPE_REFUSED)],
)
def test_stripe_verify_reads_only_the_documented_format(header: str, accepted: bool) -> None:
    signed, digest = _stripe_example()
    value = header.format(
        h=signed, t=STRIPE_T, d=digest, D=digest.upper(), z="0" * 64, short=digest[:-1]
    )
    assert (
        verify_stripe_signature("whsec_test_secret", _STRIPE_BODY, value, now=STRIPE_T) is accepted
    )


def test_stripe_verify_refuses_an_empty_secret() -> None:
    header = stripe_signature("whsec_a", b"{}", STRIPE_T)
    assert not verify_stripe_signature("", b"{}", header, now=STRIPE_T)
    with pytest.raises(ValueError, match="secret"):
        stripe_signature("", b"{}", STRIPE_T)
    with pytest.raises(ValueError, match="timestamp"):
        stripe_signature("whsec_a", b"{}", -1)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"not json",
        b'{"type": "x"}',
        b'{"id": "evt_1"}',
        b'{"id": 5, "type": "x"}',
        b'{"id": "", "type": "x"}',
        b'{"id": "evt_1", "type": "' + b"x" * 201 + b'"}',
        b'{"id": "evt\\u0001", "type": "x"}',
    ],
)
def test_stripe_parse_refuses_what_is_not_an_event(body: bytes) -> None:
    with pytest.raises(MalformedDelivery):
        StripeProvider().parse(body, {})


def test_manual_with_stripe_scheme_verifies_and_parses_like_stripe(payloads: PayloadSet) -> None:
    sample = payloads.stripe_event("customer.created")
    body, headers, secret = sample.body, sample.lower_headers(), payloads.stripe_secret
    manual = ManualProvider().for_config({"signature": "stripe"})
    with time_machine.travel(sample.signed_at + 1, tick=False):
        assert manual.verify(secret, body, headers)
        # GitHub's scheme (the default) does not accept a Stripe signature.
        assert not ManualProvider().verify(secret, body, headers)
    assert manual.parse(body, headers).event == "customer.created"
